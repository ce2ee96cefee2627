"""First contact with `apex3 data`: an optional dependency a command needs (ray for `--executor ray`, pyarrow for a
parquet source) is asked for in one line, exit 2, before any work, in a subprocess where it cannot be imported; the
control puts a stand-in module on the path and shows the check is what refused. `[tokenize] enabled = false` stops
a run after the sources' last stages: no tokenizer, no token shards, and the stage table ends at the last enabled
stage; the default still tokenizes."""
import json, os, subprocess, sys, textwrap
from pathlib import Path
import pytest
from apex3.data.pipeline import config_errors, load_config, run_pipeline, STAGE_HEADER

ROOT = Path(__file__).parents[1]
CLI = 'import sys; from apex3.cli import main; sys.exit(main())'

def blocked(*modules) -> str:
    "Python that makes `modules` impossible to import (as on an install without them), then runs the CLI."
    return textwrap.dedent(f'''
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split('.')[0] in {set(modules)!r}:
                    raise ModuleNotFoundError(f'No module named {{name!r}}', name=name)
        sys.meta_path.insert(0, Block())
        for m in {list(modules)!r}: sys.modules[m] = None
    ''') + CLI

def apex3(code, *args, cwd, extra_path=()):
    path = [*map(str, extra_path), str(ROOT), os.environ.get('PYTHONPATH', '')]
    return subprocess.run([sys.executable, '-c', code, *map(str, args)], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, 'PYTHONPATH': os.pathsep.join(path)}, timeout=120)

def shards(folder):
    from apex3.data.core import Document, write_docs
    write_docs(Path(folder)/'s0.jsonl.zst', [Document('a', 'mail bob@example.org'), Document('b', 'plain text')])
    return folder

def fake_module(folder, name) -> Path:
    "A stand-in package `name` that any import of reports (so a run that gets past the check says so)."
    (folder/name).mkdir(parents=True)
    (folder/name/'__init__.py').write_text(f"raise RuntimeError('the stand-in {name} was imported')\n")
    return folder

NEEDS_RAY = "apex3 data: error: --executor ray needs ray: pip install -e '.[ray]'\n"

@pytest.mark.parametrize('what', [['demo', 'OUT'], ['run', 'c.toml'], ['redact', 'in', 'OUT']])
def test_executor_ray_without_ray_is_one_line_before_any_work(tmp_path, what):
    shards(tmp_path/'in')
    p = apex3(blocked('ray'), 'data', *what, '--executor', 'ray', cwd=tmp_path)
    assert (p.returncode, p.stderr) == (2, NEEDS_RAY), p.stderr[-2000:]
    assert not (tmp_path/'OUT').exists()  # refused before the corpus (or anything) was written

def test_executor_ray_control_with_ray_on_the_path(tmp_path):
    "The control: where `ray` can be found, the same command gets past the check and goes on to import it."
    shards(tmp_path/'in')
    p = apex3(CLI, 'data', 'redact', 'in', 'OUT', '--executor', 'ray', cwd=tmp_path,
              extra_path=[fake_module(tmp_path/'site', 'ray')])
    assert p.returncode != 0 and 'the stand-in ray was imported' in p.stderr and NEEDS_RAY not in p.stderr, p.stderr

def parquet_config(tmp_path) -> Path:
    (tmp_path/'raw').mkdir()
    (tmp_path/'raw'/'a.parquet').write_bytes(b'PAR1')  # the check looks at the module, not at the file
    (tmp_path/'c.toml').write_text('[[source]]\nname = "p"\nkind = "parquet"\npath = "raw/*.parquet"\n'
                                   '[[source]]\nname = "q"\nkind = "jsonx"\npath = "raw/*.parquet"\n')
    return tmp_path/'c.toml'

def test_parquet_without_pyarrow_is_one_of_the_configs_errors(tmp_path):
    cfg = parquet_config(tmp_path)
    p = apex3(blocked('pyarrow'), 'data', 'run', cfg, cwd=tmp_path)
    assert p.returncode == 2 and p.stderr.count('\n') == 1 and 'Traceback' not in p.stderr, p.stderr[-2000:]
    assert p.stderr.startswith(f'apex3 data: error: {cfg}: 2 problems: '), p.stderr
    assert "source[0].kind: parquet needs pyarrow: pip install -e '.[parquet]'" in p.stderr
    assert "source[1].kind: unknown kind 'jsonx'" in p.stderr   # reported with the others, at once
    assert not (tmp_path/'out').exists()

def test_parquet_control_with_pyarrow(tmp_path, monkeypatch):
    "The control: pyarrow importable (a stand-in on the path, or the real one) leaves only the unknown kind."
    cfg = parquet_config(tmp_path)
    p = apex3(blocked(), 'data', 'run', cfg, cwd=tmp_path, extra_path=[fake_module(tmp_path/'site', 'pyarrow')])
    assert p.returncode == 2 and 'pyarrow' not in p.stderr and '1 problem: ' in p.stderr, p.stderr
    import tomllib
    parsed = tomllib.loads(cfg.read_text())
    monkeypatch.setitem(sys.modules, 'pyarrow', None)   # blocked in this process: the same check fires
    assert any('parquet needs pyarrow' in e for e in config_errors(parsed, tmp_path))

def small_run(tmp_path, tokenize: str):
    (tmp_path/'raw').mkdir(exist_ok=True)
    words = ' '.join(f'w{i % 97}' for i in range(400))
    (tmp_path/'raw'/'a.jsonl').write_text(''.join(json.dumps({'text': f'{k} {words}'}) + '\n' for k in range(6)) +
                                          json.dumps({'text': f'0 {words}'}) + '\n')
    (tmp_path/'c.toml').write_text('[pipeline]\nout = "out"\n[[source]]\nname = "s"\nkind = "jsonl"\n'
                                   f'path = "raw/*.jsonl"\nshards = 2\nstages = ["redact", "dedup"]\n{tokenize}'
                                   '[long]\nmin_tokens = 8\n')
    cfg, lines = load_config(tmp_path/'c.toml'), []
    recs = run_pipeline(cfg, log=lines.append)
    return Path(cfg['pipeline']['out']), lines, recs

def test_tokenize_off_stops_after_the_last_enabled_stage(tmp_path):
    out, lines, recs = small_run(tmp_path, '[tokenize]\nenabled = false\nvocab_size = 300\n')
    assert lines[0] == STAGE_HEADER and lines[-1].split()[0] == 's:dedup:filter', lines
    assert not (out/'tokens').exists() and not (out/'tokenizer').exists()
    assert {r['stage'] for r in recs} == {l.split()[0] for l in lines[1:]}
    assert any((out/'work'/'s').glob('*_dedup/*.jsonl.zst'))   # the deduplicated documents are the run's output

def test_tokenize_on_by_default(tmp_path):
    "The control: the same run without the switch trains a tokenizer and writes token shards after dedup."
    out, lines, _ = small_run(tmp_path, '[tokenize]\nvocab_size = 300\n')
    names = [l.split()[0] for l in lines[1:]]
    assert names.index('s:dedup:filter') < names.index('tokenizer') and any(n.startswith('tokenize') for n in names)
    assert any((out/'tokens'/'s').glob('*.bin')) and (out/'tokenizer'/'tokenizer.json').is_file()

def test_tokenize_off_from_the_command(tmp_path):
    "`apex3 data run` with tokenization off exits 0 and reports the run without a token table."
    small_run(tmp_path, '[tokenize]\nenabled = false\n')
    p = apex3(CLI, 'data', 'run', 'c.toml', cwd=tmp_path)
    assert p.returncode == 0 and 'tokenization is off' in p.stdout and 'tokens per source' not in p.stdout, p.stderr


# --- running it again: the embedded corpus is the same bytes every time, and `apex3 demo` redoes what changed ------

def test_data_demo_run_again_a_second_later_reuses_every_task(tmp_path):
    """`apex3 data demo` into the same folder twice, more than a second apart (a gzip header holds the second it was
    written): the second run finds its input unchanged and exits 0. The control shows the gap is enough to tell a
    time-stamped archive from the one before it."""
    import gzip, time
    first = apex3(CLI, 'data', 'demo', tmp_path / 'd', '--max-files', '3', cwd=tmp_path)
    stamped = gzip.compress(b'x')
    time.sleep(1.1)
    again = apex3(CLI, 'data', 'demo', tmp_path / 'd', '--max-files', '3', cwd=tmp_path)
    assert (first.returncode, again.returncode) == (0, 0), again.stderr
    assert gzip.compress(b'x') != stamped   # the control: the same data, compressed a second later, differs


def test_demo_run_again_with_other_files_redoes_what_changed(tmp_path):
    """The README's first command run again into its folder with another `--max-files` (or by another apex3) exits 0:
    the demo owns `OUT/data`, and redoes the tasks whose inputs changed. The control, `apex3 data demo` into that
    folder as a user runs it, refuses the changed tasks in one line."""
    run = lambda *a: apex3(CLI, 'demo', '--out', tmp_path / 'o', '--minutes', '0.02', '--agent-steps', '2', *a,
                           cwd=tmp_path)
    assert run('--max-files', '3').returncode == 0
    again = run('--max-files', '4')
    assert again.returncode == 0, again.stderr[-600:]
    plain = apex3(CLI, 'data', 'demo', tmp_path / 'o' / 'data', '--max-files', '5', cwd=tmp_path)
    assert plain.returncode == 2 and plain.stderr.count('\n') == 1 and '--restart' in plain.stderr, plain.stderr


def test_a_second_demo_into_a_folder_in_use_is_refused(tmp_path):
    """Two `apex3 demo` runs into one folder at once would train into the same checkpoint folder, each printing the
    other's results: the second is refused in one line while the first holds the folder, and the first ends well.
    The control: the same second run after the first has ended goes through (`..._redoes_what_changed` above)."""
    import time
    args = ['demo', '--out', tmp_path / 'o', '--max-files', '3', '--minutes', '0.05', '--agent-steps', '2']
    path = [str(ROOT), os.environ.get('PYTHONPATH', '')]
    first = subprocess.Popen([sys.executable, '-c', CLI, *map(str, args)], cwd=tmp_path, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True, env={**os.environ, 'PYTHONPATH': os.pathsep.join(path)})
    for _ in range(600):   # past its data phase (whose folder has a lock of its own): training
        if (tmp_path / 'o' / 'train').exists(): break
        time.sleep(0.1)
    second = apex3(CLI, *args, cwd=tmp_path)
    assert first.wait(300) == 0, first.stderr.read()
    assert second.returncode == 2 and second.stderr.count('\n') == 1, second.stderr
    assert second.stderr.startswith('apex3 demo: error:') and 'being written by another run now' in second.stderr
