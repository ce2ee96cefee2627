"""Bad values on every flag of every `apex3` command: exit status 2, one line on stderr, no traceback.

The commands are found from the CLI itself, not listed here: a dispatcher (`apex3`, `apex3 agent`) is read from the
table its `--help` prints, and a command's flags from the `ArgParser` it builds, caught the moment it starts to
parse (so discovery runs nothing). Each flag then gets values hypothesis draws from the classes no reading of it can
accept: empty, not a number, nan, inf, negative, past any machine integer or any physical quantity, an unknown
choice, a value for a switch, no value at all. A flag whose type is `usage.in_range` also gets zero and values just
outside its bounds; a plain `int`/`float` says nothing about zero, so zero is not thrown at it. Required arguments
get a placeholder (the first choice, a number its type takes, or a path that does not exist), so the value checks
that run after parsing are reached too.

Most cases run in-process (`apex3.cli.main(argv)`, outputs captured, an alarm as the watchdog: a command still
running after `STUCK_S` took a bad value and started work); a sample runs as real subprocesses, the outside check.
"""
import argparse, contextlib, io, math, os, re, shlex, signal, subprocess, sys
from pathlib import Path
import pytest
from hypothesis import HealthCheck, Phase, given, settings, strategies as st
from apex3.cli import COMMANDS, main
from apex3.agent.cli import AGENT_COMMANDS
from apex3.usage import INT_MAX, ArgParser

ROOT = Path(__file__).parents[1]
STUCK_S = 6           # in-process, modules already imported by discovery: a refusal takes well under this
MISSING = 'no-such-input-apex3-fuzz'   # a placeholder path that exists nowhere
SLOW = {('train',), ('bench',)}        # they import torch before they check flags: fewer examples

class _Caught(BaseException):
    "Raised in place of parsing: carries the parser a command built."
    def __init__(self, parser): self.parser = parser

class _Stuck(BaseException):
    "The watchdog's alarm: a BaseException, so a command's `except Exception` cannot swallow it."

@contextlib.contextmanager
def _watchdog(seconds):
    def ring(signum, frame): raise _Stuck(f'still running after {seconds} s: it took a bad value and started work')
    old = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try: yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)

def run_inprocess(argv, seconds=STUCK_S):
    "`apex3 *argv` in-process: (status, stdout, stderr). An exception escaping `main` is a status: its text."
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            with _watchdog(seconds): rc = main(list(argv))
        except SystemExit as e: rc = e.code   # argparse's --help
        except (Exception, _Stuck) as e: rc = f'raised {type(e).__name__}: {e}'
    return rc, out.getvalue(), err.getvalue()

def check_refused(argv, rc, err):
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and 'Traceback' not in err, \
        f'apex3 {shlex.join(argv)}\n  -> status {rc!r}, {len(lines)} stderr lines:\n{err[-2000:]}'

# --- discovery -------------------------------------------------------------------------------------------------

def _parser_of(path):
    "The ArgParser `apex3 *path --help` builds, caught as it starts parsing; None for a dispatcher."
    def caught(self, *a, **k): raise _Caught(self)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(ArgParser, 'parse_known_args', caught)
        try: rc, out, err = run_inprocess([*path, '--help'], seconds=300)   # imports each command's module once
        except _Caught as c: return c.parser
    assert not isinstance(rc, str), (path, rc)
    return None

def _subcommands(path):
    "The names in the table of commands a dispatcher's --help prints."
    rc, out, err = run_inprocess([*path, '--help'])
    assert rc == 0 and '\ncommands:\n' in out, (path, rc, out, err)
    return re.findall(r'^  (\S+) ', out.split('\ncommands:\n', 1)[1], re.M)

def discover(path=()):
    "[(path, parser)] of every command under `apex3 *path`."
    parser = _parser_of(path)
    if parser is not None: return [(path, parser)]
    return [leaf for name in _subcommands(path) for leaf in discover((*path, name))]

LEAVES = discover()
PARSERS = dict(LEAVES)

def _flags(parser):
    return [a for a in parser._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]

def test_discovery_finds_every_command():
    "The independent reference: the dispatch tables themselves."
    want = {(k,) for k in COMMANDS if k != 'agent'} | {('agent', k) for k in AGENT_COMMANDS}
    assert set(PARSERS) == want
    assert sum(len(_flags(p)) for p in PARSERS.values()) > 150

# --- a placeholder for what is required ------------------------------------------------------------------------

def _accepts(action, text):
    try: (action.type or str)(text)
    except (ValueError, TypeError, argparse.ArgumentTypeError): return False
    return True

def _placeholder(action):
    if action.choices: return str(next(iter(action.choices)))
    if action.type in (None, str): return MISSING
    return next(v for v in ('1', '1M', '1.0') if _accepts(action, v))

def _required_groups(parser):
    return [g for g in parser._mutually_exclusive_groups if g.required]

# A valid-looking invocation where placeholders cannot make one (a positional the parser leaves optional but the
# command needs, a stage name the parser does not list): with it the checks that run after parsing are reached.
# `train` gets real byte shards (the `train_data` fixture), so an accepted bad value shows up as a run that starts.
EXAMPLES = {('plan',): ['70B'], ('data',): ['run', MISSING]}

@pytest.fixture(scope='module', autouse=True)
def train_data(tmp_path_factory):
    from apex3.train_io import byte_shards
    shards = byte_shards(tmp_path_factory.mktemp('bytes'), 20_000, n_shards=1)
    EXAMPLES[('train',)] = ['--config', 'tiny', '--set', 'vocab_size=257', '--eos-id', '256',
                            '--data', f'bytes=1:{shards}/shard-*.bin', '--total-tokens', '4096']

def baseline(parser, path=()):
    "Argv that satisfies `parser`'s required arguments with placeholders: positionals first, then options."
    if path in EXAMPLES: return EXAMPLES[path]
    pos = [_placeholder(a) for a in parser._actions if not a.option_strings and a.nargs not in ('*', '?', '...')]
    grouped = {id(a) for g in _required_groups(parser) for a in g._group_actions}
    opts = [[a.option_strings[-1], _placeholder(a)] for a in _flags(parser) if a.required and id(a) not in grouped]
    firsts = [g._group_actions[0] for g in _required_groups(parser)]   # one of each required either-or
    opts += [[a.option_strings[-1], _placeholder(a)] for a in firsts]
    return pos + [x for o in opts for x in o]

# --- bad values ------------------------------------------------------------------------------------------------

def _is_float(s):
    try: float(s)
    except ValueError: return False
    return True

def _kind(action):
    "int or float for a numeric flag (its type, or what its custom type takes), else None."
    t = action.type
    if t in (int, float): return t
    if getattr(t, 'kind', None) in (int, float): return t.kind
    if t not in (None, str) and _accepts(action, '1'): return float if _accepts(action, '1.5') else int
    return None

EMPTY = st.sampled_from(['', ' '])
WORDS = st.text(st.characters(categories=['L']), min_size=1, max_size=8).filter(lambda s: not _is_float(s))
NAN = st.sampled_from(['nan', 'NaN', '-nan'])
INF = st.sampled_from(['inf', '-inf', 'Infinity', '1e999'])
FRACTION = st.floats(0.01, 1e6).filter(lambda x: x != int(x)).map(repr)

def _out_of_range(t):
    "Values just outside an `in_range` type's declared bounds (zero among them where zero is outside)."
    vals = []
    if t.low is not None: vals += [t.low] if t.low_open else [t.low - (1 if t.kind is int else 1e-3)]
    if t.low is not None and (t.low > 0 or t.low_open): vals.append(0)
    if t.high is not None and t.high < INT_MAX: vals.append(t.high + (1 if t.kind is int else max(1e-3, t.high)))
    return [str(t.kind(v)) for v in vals]

def bad_values(action):
    "A strategy of values no reading of `action` accepts."
    if action.choices:
        names = {str(c) for c in action.choices}
        return st.one_of(EMPTY, st.text(max_size=12).filter(lambda s: s not in names))
    kind = _kind(action)
    if kind is None: return EMPTY   # a free string (a path, a name): only empty is wrong whatever it names
    classes = [EMPTY, WORDS, NAN, INF]
    if kind is int:
        classes += [st.integers(max_value=-1).map(str), st.integers(2**63, 10**40).map(str), FRACTION]
    else:
        classes += [st.floats(max_value=-1e-6, allow_infinity=False).map(repr), st.floats(1e300, 1.7e308).map(repr)]
    if getattr(action.type, 'kind', None) and _out_of_range(action.type):
        classes.append(st.sampled_from(_out_of_range(action.type)))
    return st.one_of(classes)

def representatives(action):
    "One value of each bad class, so every class meets every flag whatever hypothesis draws."
    flag = action.option_strings[-1]
    if action.nargs == 0: return [[f'{flag}=x']]
    kind = _kind(action)
    vals = ['', 'no-such-choice'] if action.choices else [''] if kind is None else \
           ['', 'abc', 'nan', 'inf', '-inf', '-1', str(2**64) if kind is int else '1e300']
    if kind is int: vals.append('1.5')
    if getattr(action.type, 'kind', None): vals += _out_of_range(action.type)
    return [[f'{flag}={v}'] for v in vals] + [[flag]]

def bad_fragment(action):
    "Argv pieces that give `action` a bad value (or, for a switch, any value; for an option, none)."
    flag = action.option_strings[-1]
    if action.nargs == 0: return st.text(max_size=6).map(lambda v: [f'{flag}={v}'])
    as_one = bad_values(action).map(lambda v: [f'{flag}={v}'])
    as_two = bad_values(action).filter(lambda v: not v.startswith('-')).map(lambda v: [flag, v])
    return st.one_of(as_one, as_two, st.just([flag]))   # the last: the value is missing

FUZZ = settings(deadline=None, phases=[Phase.explicit, Phase.generate], derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))

@pytest.fixture(scope='module', autouse=True)
def scratch_dir(tmp_path_factory):
    "Every case runs in an empty folder: a command that wrongly starts work writes nothing into the repository."
    old = os.getcwd()
    os.chdir(tmp_path_factory.mktemp('fuzz'))
    yield
    os.chdir(old)

CASES = [pytest.param(path, a.option_strings[-1], id=f"{' '.join(path)} {a.option_strings[-1]}")
         for path, p in LEAVES for a in _flags(p)]

@pytest.mark.parametrize('path,flag', CASES)
def test_bad_flag_value_is_one_line(path, flag):
    parser = PARSERS[path]
    action = next(a for a in _flags(parser) if a.option_strings[-1] == flag)
    def one(fragment):
        argv = [*path, *baseline(parser, path), *fragment]
        rc, out, err = run_inprocess(argv)
        check_refused(argv, rc, err)
    for fragment in representatives(action): one(fragment)
    settings(FUZZ, max_examples=2 if path in SLOW else 6)(given(bad_fragment(action))(one))()

def _unknown_flag(parser):
    known = [o for a in parser._actions for o in a.option_strings]
    names = st.from_regex(r'--[a-z][a-z0-9-]{0,12}', fullmatch=True)
    return names.filter(lambda f: not any(k.startswith(f) for k in known))   # argparse takes unique prefixes

@pytest.mark.parametrize('path', [pytest.param(p, id=' '.join(p)) for p, _ in LEAVES])
def test_unknown_flags_and_missing_arguments(path):
    parser = PARSERS[path]
    base = baseline(parser, path)
    for i in range(len(base)):   # each required piece left out in turn (a flag without its value, or its value)
        argv = [*path, *base[:i], *base[i + 1:]]
        check_refused(argv, *run_inprocess(argv)[::2])
    @settings(FUZZ, max_examples=2 if path in SLOW else 5)
    @given(_unknown_flag(parser), st.sampled_from(['', '1', 'x']))
    def one(flag, value):
        argv = [*path, *base, *filter(None, [flag, value])]
        check_refused(argv, *run_inprocess(argv)[::2])
    one()

# --- the outside check: real processes -------------------------------------------------------------------------

def _sample(path, parser):
    "One bad argv per command for the subprocess check: a numeric flag given nan, else an unknown flag."
    numeric = [a for a in _flags(parser) if _kind(a)]
    bad = [f'{numeric[0].option_strings[-1]}=nan'] if numeric else ['--no-such-flag-apex3']
    return [*path, *baseline(parser, path), *bad]

def test_real_processes(tmp_path):
    "The same rules from outside: the console entry point, a fresh interpreter, stderr as a terminal would get it."
    env = {**os.environ, 'PYTHONPATH': str(ROOT)}
    argvs = [_sample(path, p) for path, p in LEAVES] + [['no-such-command'], ['agent', 'no-such-command']]
    entry = [sys.executable, '-c', 'import sys; from apex3.cli import main; sys.exit(main())']
    procs = [(argv, subprocess.Popen(entry + argv, cwd=tmp_path, env=env, text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)) for argv in argvs]
    for argv, proc in procs:
        try: out, err = proc.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        check_refused(argv, proc.returncode, err)

if __name__ == '__main__':   # every failing (command, flag, class), for a report: python tests/test_cli_fuzz.py [CMD]
    import tempfile
    from apex3.train_io import byte_shards
    os.chdir(tempfile.mkdtemp())
    shards = byte_shards(Path('bytes'), 20_000, n_shards=1)
    EXAMPLES[('train',)] = ['--config', 'tiny', '--set', 'vocab_size=257', '--eos-id', '256',
                            '--data', f'bytes=1:{shards.resolve()}/shard-*.bin', '--total-tokens', '4096']
    for path, parser in LEAVES:
        if path[:len(sys.argv) - 1] != tuple(sys.argv[1:]): continue   # `... train`: that command only
        for action in _flags(parser):
            for fragment in representatives(action):
                argv = [*path, *baseline(parser, path), *fragment]
                rc, out, err = run_inprocess(argv, seconds=8)
                lines = err.strip().splitlines()
                if not (rc == 2 and len(lines) == 1 and 'Traceback' not in err):
                    last = (lines or [''])[-1][:160]
                    print(f'apex3 {shlex.join(argv)}\t{rc!r}\t{len(lines)} lines\t{last}', flush=True)
