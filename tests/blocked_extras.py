"""Run in a subprocess by `test_optional_deps.py`: make the top-level names in `APEX3_BLOCKED` unimportable (as if
their packages were not installed), then import every `apex3` module and run every `apex3 ... --help`, printing one
JSON object of what happened. Stand-alone on purpose: it must install the blocker before anything imports."""
import contextlib, importlib, importlib.util, io, json, os, pkgutil, sys, traceback


class Hiding:
    """Wraps one meta-path finder: it finds nothing for the blocked top-level names and their submodules, so
    `import triton` raises `ModuleNotFoundError` and `importlib.util.find_spec('triton')` is None, as when the package
    is not installed (a finder that raised instead would break libraries that probe with `find_spec`)."""
    def __init__(self, finder, names): self.finder, self.names = finder, names
    def find_spec(self, fullname, path=None, target=None):
        if fullname.partition('.')[0] in self.names: return None
        find = getattr(self.finder, 'find_spec', None)
        return find(fullname, path, target) if find else None
    def invalidate_caches(self):
        if hasattr(self.finder, 'invalidate_caches'): self.finder.invalidate_caches()
    def __getattr__(self, name): return getattr(self.finder, name)


def install_blocker(names):
    "Hide `names` from now on in this process (nothing of them may have been imported yet)."
    if loaded := sorted(n for n in names if n in sys.modules): raise RuntimeError(f'already imported: {loaded}')
    sys.meta_path[:] = [Hiding(f, frozenset(names)) for f in sys.meta_path]


def importable(name):
    "(True, '') when `import name` works, else (False, the error's one line)."
    try: importlib.import_module(name)
    except Exception as e: return False, f'{type(e).__name__}: {e}'
    return True, ''


def import_all():
    "module -> the traceback's last lines, for every module of the package that fails to import."
    import apex3
    failed = {}
    names = [m.name for m in pkgutil.walk_packages(apex3.__path__, 'apex3.', onerror=lambda n: failed.setdefault(
        n, traceback.format_exc(limit=-3)))]
    for name in names:
        try: importlib.import_module(name)
        except BaseException: failed[name] = traceback.format_exc(limit=-3)
    return names, failed


def help_argvs():
    "Every `apex3 COMMAND --help`, and the same for the words `agent` and `data` dispatch on."
    from apex3.cli import COMMANDS
    from apex3.agent.cli import AGENT_COMMANDS
    from apex3.data.pipeline import STEPS
    argvs = [['--help']] + [[c, '--help'] for c in COMMANDS]
    argvs += [['agent', c, '--help'] for c in AGENT_COMMANDS]
    argvs += [['data', w, '--help'] for w in ('run', 'demo', 'corpus', 'dedup', *STEPS)]
    return argvs


def run_help(argv):
    "(exit status, stdout, stderr) of `apex3 *argv` in this process."
    from apex3.cli import main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try: rc = main(argv)
        except SystemExit as e: rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException: rc, _ = 1, err.write(traceback.format_exc(limit=-3))
    return rc, out.getvalue(), err.getvalue()


def main():
    blocked = [n for n in os.environ.get('APEX3_BLOCKED', '').split(',') if n]
    install_blocker(blocked)
    report = {'blocked': {n: importable(n)[1] for n in blocked}}   # each must have failed: the control
    report['triton_spec'] = repr(importlib.util.find_spec('triton'))
    report['modules'], report['import_failures'] = import_all()
    report['help'] = {' '.join(a): run_help(a) for a in help_argvs()}
    print(json.dumps(report))


if __name__ == '__main__': main()
