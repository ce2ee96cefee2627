"""No optional dependency is needed by accident: with every package that only the `dev`, `lab`, `ray` and `parquet`
extras bring made unimportable, every `apex3` module imports and every `apex3 ... --help` exits 0."""
import functools, importlib.metadata as md, json, os, subprocess, sys, tomllib
from pathlib import Path
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).parents[1]
RUNNER = Path(__file__).with_name('blocked_extras.py')
EXTRAS = ('dev', 'lab', 'ray', 'parquet')


def project():
    return tomllib.loads((ROOT / 'pyproject.toml').read_text())['project']


def requirements(extras=()):
    "The project's base requirements, or those of `extras`."
    p = project()
    reqs = p['dependencies'] if not extras else [r for e in extras for r in p['optional-dependencies'][e]]
    return [Requirement(r) for r in reqs]


def closure(reqs):
    """Canonical names of the distributions `reqs` install, with what they require in turn, following the extras a
    requirement asks for (`pyjwt[crypto]` brings cryptography, and with it cffi) and no others."""
    seen, todo = set(), [(canonicalize_name(r.name), e) for r in reqs for e in ('', *r.extras)]
    while todo:
        name, extra = todo.pop()
        if (name, extra) in seen: continue
        seen.add((name, extra))
        try: needs = md.requires(name) or []
        except md.PackageNotFoundError: continue    # not installed here: blocked by its own name below
        todo += [(canonicalize_name(r.name), e) for r in map(Requirement, needs)
                 if r.marker is None or r.marker.evaluate({'extra': extra}) for e in ('', *r.extras)]
    return {name for name, _ in seen}


@functools.cache
def modules_of():
    "canonical distribution name -> the top-level modules it installs."
    out = {}
    for mod, dists in md.packages_distributions().items():
        for d in dists: out.setdefault(canonicalize_name(d), set()).add(mod)
    return out


def top_level(dists):
    "Top-level module names of `dists` (a distribution that is not installed: its name as a module)."
    return {m for d in dists for m in modules_of().get(d, {d.replace('-', '_')})}


def blocked_names():
    """The extras' own packages, always (triton even where torch requires it), and every package only the extras bring
    in (not the base install): their top-level module names."""
    base = closure(requirements())
    direct = {canonicalize_name(r.name) for r in requirements(EXTRAS)}
    only_extras = closure(requirements(EXTRAS)) - base
    names = top_level(direct) | (top_level(only_extras) - top_level(base))
    return sorted(n for n in names if n.isidentifier() and n not in sys.stdlib_module_names)


def run_blocked(names):
    "The runner's JSON report, run in a fresh interpreter that cannot import `names`."
    env = {**os.environ, 'APEX3_BLOCKED': ','.join(names), 'PYTHONPATH': str(ROOT), 'MPLBACKEND': 'Agg'}
    r = subprocess.run([sys.executable, str(RUNNER)], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)


@pytest.fixture(scope='module')
def blocked_report(): return run_blocked(blocked_names())


def test_blocked_names_cover_the_extras():
    names = set(blocked_names())
    assert {'triton', 'torchao', 'transformers', 'nbdev', 'fastcore', 'pyarrow', 'ray', 'hypothesis', 'mkdocs',
            'pytest', 'xdist', 'material', 'mkdocs_jupyter', 'jupyterlab', 'mcp_server_time'} <= names
    assert not names & {'torch', 'numpy', 'pandas', 'matplotlib', 'mcp', 'jinja2', 'tokenizers'}, 'base packages'


def test_the_blocker_blocks(blocked_report):
    "The control: inside the subprocess each blocked name fails to import as a missing package would."
    errors = blocked_report['blocked']
    assert errors and all(e.startswith('ModuleNotFoundError') for e in errors.values()), errors
    assert "No module named 'triton'" in errors['triton']
    assert blocked_report['triton_spec'] == 'None', 'find_spec answers as for a package that is not installed'


def test_without_the_blocker_triton_imports():
    "The same run with nothing blocked imports triton: the failure above comes from the blocker, not the machine."
    pytest.importorskip('triton')
    code = 'import importlib.util, triton; print(importlib.util.find_spec("triton") is not None)'
    r = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=120)
    assert (r.returncode, r.stdout.strip()) == (0, 'True'), r.stderr


def test_every_module_imports_without_the_extras(blocked_report):
    mods = blocked_report['modules']
    assert {'apex3.kernels.ce', 'apex3.kernels.gemv', 'apex3.kernels.decode_attention', 'apex3.generate',
            'apex3.agent.demo', 'apex3.data.ray_cluster', 'apex3.train'} <= set(mods), 'the walk found every module'
    assert blocked_report['import_failures'] == {}, '\n'.join(blocked_report['import_failures'].values())


def test_every_help_exits_0_without_the_extras(blocked_report):
    helps = blocked_report['help']
    assert {'generate --help', 'demo --help', 'agent demo --help', 'data run --help'} <= set(helps)
    bad = {argv: err[-600:] for argv, (rc, out, err) in helps.items() if rc != 0 or 'usage' not in out.lower()}
    assert bad == {}, bad


def apex3_without(names, argv):
    "(exit status, stdout, stderr) of `apex3 *argv` in a fresh interpreter that cannot import `names`."
    code = (f'import sys; sys.path.insert(0, {str(RUNNER.parent)!r}); import blocked_extras as b; '
            f'b.install_blocker({list(names)!r}); from apex3.cli import main; sys.exit(main({list(argv)!r}))')
    r = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, cwd=ROOT, timeout=300,
                       env={**os.environ, 'PYTHONPATH': str(ROOT), 'MPLBACKEND': 'Agg'})
    return r.returncode, r.stdout, r.stderr


def test_a_missing_base_package_is_one_line():
    """An install without its dependencies (`pip install --no-deps`, a broken venv): a command whose module needs a
    missing base package says so in one line and exits 2, naming the package, where it was an import traceback."""
    rc, out, err = apex3_without(['zstandard'], ['data', '--help'])
    assert rc == 2 and err.count('\n') == 1, err
    assert err.startswith('apex3 data: error:') and "needs the Python package 'zstandard'" in err, err
    assert out == ''
    # controls: a command that does not need it runs; with nothing blocked, the same command's help exits 0
    assert apex3_without(['zstandard'], ['plan', '--help'])[0] == 0
    assert apex3_without([], ['data', '--help'])[:1] == (0,)
