"""`apex3 data run CONFIG` checks the whole config first: hypothesis plants mistakes (bad values of every key, unknown
keys, kinds and stages, missing keys, paths that match nothing) and the run exits 2 with one line on stderr that names
every planted key, no traceback, before any output is written. The reference for what a key accepts is written out
here, independently of the code's schema."""
import json, math, os, subprocess, sys, tempfile
from pathlib import Path
from hypothesis import given, settings, strategies as st, HealthCheck
from apex3.cli import run_cli

def valid_int(lo, hi=None): return lambda v: type(v) is int and v >= lo and (hi is None or v <= hi)
text_ok = lambda v: isinstance(v, str) and v.strip() != ''
strs_ok = lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v)
# (table, key) -> does the value do; the keys a typo must not hit
ACCEPTS = {('pipeline', 'workers'): valid_int(1, 1024), ('pipeline', 'downloads'): valid_int(1, 64),
           ('source', 'shards'): valid_int(1, 65536), ('source', 'max_line_bytes'): valid_int(1, 32 << 20),
           ('source', 'max_doc_bytes'): valid_int(1, 32 << 20), ('source', 'max_json_depth'): valid_int(1, 500),
           ('source', 'text_key'): text_ok, ('source', 'stages'): strs_ok, ('source', 'extensions'): strs_ok,
           ('tokenize', 'vocab_size'): valid_int(256, 1 << 22), ('tokenize', 'sample_bytes'): valid_int(1),
           ('long', 'enabled'): lambda v: type(v) is bool, ('tokenize', 'enabled'): lambda v: type(v) is bool,
           ('long', 'min_tokens'): valid_int(1)}
KNOWN = {'pipeline': {'out', 'workers', 'downloads'},
         'tokenize': {'enabled', 'vocab_size', 'sample_bytes', 'tokenizer_json'}, 'long': {'enabled', 'min_tokens'},
         'source': {'name', 'kind', 'path', 'url', 'urls', 'sha256', 'manifest',
         'shards', 'text_key', 'extensions', 'exclude', 'max_line_bytes', 'max_doc_bytes', 'max_json_depth', 'stages'}}
CLI = 'import sys; from apex3.cli import main; sys.exit(main())'
STAGES = {'gopher_quality', 'gopher_repetition', 'c4', 'fineweb', 'code', 'decontaminate', 'redact', 'repopack', 'dedup'}

def toml_string(v) -> str:
    "A TOML basic string: JSON's escapes, and DEL escaped too (JSON leaves it bare, TOML refuses it bare)."
    return json.dumps(v, ensure_ascii=False).replace('\x7f', '\\u007f')

def toml_value(v) -> str:
    if isinstance(v, bool): return 'true' if v else 'false'
    if isinstance(v, float): return 'nan' if math.isnan(v) else ('inf' if v > 0 else '-inf') if math.isinf(v) else repr(v)
    if isinstance(v, str): return toml_string(v)
    if isinstance(v, list): return '[' + ', '.join(map(toml_value, v)) + ']'
    return str(v)

def toml(cfg) -> str:
    "TOML for a dict of tables and a list of [[source]] tables (only the value types used here)."
    out = []
    for k, t in cfg.items():
        if k == 'source': continue
        out += [f'[{k}]'] + [f'{toml_string(kk)} = {toml_value(v)}' for kk, v in t.items()]
    for s in cfg['source']: out += ['[[source]]'] + [f'{toml_string(kk)} = {toml_value(v)}' for kk, v in s.items()]
    return '\n'.join(out) + '\n'

def base_config():
    return {'pipeline': {'out': 'out', 'workers': 1}, 'tokenize': {'vocab_size': 300}, 'long': {'min_tokens': 8},
            'source': [{'name': 's', 'kind': 'jsonl', 'path': 'raw/*.jsonl', 'stages': ['redact']}]}

values = st.one_of(st.integers(-5, 5), st.integers(10**7, 10**12), st.floats(), st.text(max_size=6),
                   st.booleans(), st.lists(st.integers(0, 3), max_size=2), st.lists(st.text(max_size=3), max_size=2))
name = st.text('abcdefghijklmnopqrstuvwxyz_', min_size=1, max_size=10)

@st.composite
def mistakes(draw):
    "A config with mistakes planted, and the key each one must be reported under."
    cfg, keys = base_config(), []
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(['bad_value', 'unknown_key', 'kind', 'stage', 'missing', 'path']))
        src = cfg['source'][0]
        if kind == 'bad_value':
            (table, key), v = draw(st.sampled_from(sorted(ACCEPTS))), draw(values)
            if ACCEPTS[table, key](v) or (table, key) == ('source', 'stages') and isinstance(v, list): continue
            (src if table == 'source' else cfg[table])[key] = v
            keys.append(f'source[0].{key}' if table == 'source' else f'{table}.{key}')
        elif kind == 'unknown_key':
            table, key = draw(st.sampled_from(sorted(KNOWN))), draw(name)
            if key in KNOWN[table]: continue
            (src if table == 'source' else cfg[table])[key] = draw(values)
            keys.append(f'source[0].{key}' if table == 'source' else f'{table}.{key}')
        elif kind == 'kind':
            k = draw(name)
            if k in ('jsonl', 'parquet', 'text', 'repo'): continue
            src['kind'] = k
            keys.append('source[0].kind')
        elif kind == 'stage':
            s = draw(name)
            if s in STAGES: continue
            src['stages'] = src.get('stages', []) + [s] if isinstance(src.get('stages'), list) else [s]
            keys.append('source[0].stages')
        elif kind == 'missing':
            key = draw(st.sampled_from(['kind', 'name']))
            src.pop(key, None)
            keys.append(f'source[0].{key}')
        else:
            src['path'] = 'raw/' + draw(name) + '.nothing'
            keys.append('source[0].path')
    # a mistake planted later may have replaced an earlier one's value: report only what is still wrong
    keys = [k for k in keys if still_wrong(cfg, k)]
    return cfg, sorted(set(keys))

def still_wrong(cfg, key) -> bool:
    table, k = key.split('.', 1)
    t = cfg['source'][0] if table == 'source[0]' else cfg[table]
    tname = 'source' if table == 'source[0]' else table
    if k not in t: return k in ('kind', 'name')
    v = t[k]
    if k == 'kind': return not (isinstance(v, str) and v in ('jsonl', 'parquet', 'text', 'repo'))
    if k == 'stages': return not strs_ok(v) or any(x not in STAGES for x in v)
    if k == 'path': return v.endswith('.nothing')
    if (tname, k) in ACCEPTS: return not ACCEPTS[tname, k](v)
    return k not in KNOWN[tname]

@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(mistakes())
def test_every_mistake_in_one_line(planted):
    cfg, keys = planted
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp)/'raw').mkdir()
        (Path(tmp)/'raw'/'a.jsonl').write_text('{"text": "a document"}\n')
        (Path(tmp)/'c.toml').write_text(toml(cfg))
        rc, out, err = run_cli('data', 'run', Path(tmp)/'c.toml')
        if not keys:  # every planted mistake was overwritten: the config is good
            assert rc == 0, err
            return
        assert rc == 2 and 'Traceback' not in err and err.count('\n') == 1, err
        for k in keys: assert f'{k}:' in err, (k, err)
        assert not (Path(tmp)/'out').exists()  # refused before anything was written

def test_the_issue_cases_from_the_command_line():
    "A source without `kind`, with an unknown `kind`, with a path matching no file: exit 2, one line, no traceback."
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp)/'raw').mkdir()
        (Path(tmp)/'raw'/'a.jsonl').write_text('{"text": "a document"}\n')
        for src, says in [({'name': 's', 'path': 'raw/*.jsonl'}, 'source[0].kind: missing'),
                          ({'name': 's', 'kind': 'jsnol', 'path': 'raw/*.jsonl'}, "unknown kind 'jsnol'"),
                          ({'name': 's', 'kind': 'jsonl', 'path': 'raw/*.jsn'}, 'matches no file')]:
            (Path(tmp)/'c.toml').write_text(toml({'source': [src]}))
            p = subprocess.run([sys.executable, '-c', CLI, 'data', 'run', str(Path(tmp)/'c.toml')],
                               capture_output=True, text=True)
            assert p.returncode == 2 and p.stderr.count('\n') == 1 and says in p.stderr, p.stderr
            assert 'Traceback' not in p.stderr


def test_a_tilde_in_out_is_the_home_folder_as_in_every_config_path(tmp_path):
    """`out = "~/x"` writes under $HOME, as a source's `path = "~/..."` reads from there, never into a folder named `~`
    beside the config (which invites `rm -rf ~`). The control: `out` without a tilde is still the config's folder's."""
    home, conf = tmp_path / 'home', tmp_path / 'conf'
    (home / 'raw').mkdir(parents=True)
    conf.mkdir()
    (home / 'raw' / 'a.jsonl').write_text('{"text": "a document"}\n')
    for out, lands in (('~/made', home / 'made'), ('made', conf / 'made')):
        (conf / 'c.toml').write_text(toml({'pipeline': {'out': out}, 'tokenize': {'enabled': False},
                                           'long': {'enabled': False},
                                           'source': [{'name': 's', 'kind': 'jsonl', 'path': '~/raw/*.jsonl'}]}))
        p = subprocess.run([sys.executable, '-c', CLI, 'data', 'run', str(conf / 'c.toml')], capture_output=True,
                           text=True, env={**os.environ, 'HOME': str(home)}, cwd=tmp_path)
        assert p.returncode == 0 and (lands / 'markers.json').is_file(), p.stderr
    assert not any(p.name == '~' for p in tmp_path.rglob('*'))
