"""A file-system failure escaping any `apex3` command is one line, `apex3 NAME: error: FILE: CAUSE (ERRNO)`, status 2.

Judged from outside, as a user meets it: real `apex3` processes writing into a read-only folder and into a full one.
Each folder is a tmpfs mounted in a mount namespace of the test's own (`unshare -rm`), so nothing stays mounted; where
the machine refuses that the tests skip and print why. The controls run the same command with `run_command`'s
file-system branch switched off (a traceback, status 1), and show that an error of another kind keeps its traceback.
"""
import errno, os, shutil, subprocess, sys
from pathlib import Path
import pytest
from hypothesis import given, settings, strategies as st
from apex3.usage import ArgParser, UsageError, run_command

ROOT = Path(__file__).parents[1]
# the same entry point as the console script; with 'off', run_command's file-system branch is switched off
APEX3 = '''import sys, apex3.usage as u
if sys.argv.pop(1) == 'off': u.is_fs_error = lambda e: False
from apex3.cli import main
sys.exit(main(sys.argv[1:]))'''
MOUNT = 'mount -t tmpfs -o "$0" none "$1" && shift && exec "$@"'

def _namespaces_or_skip(folder):
    why = 'no unshare here' if shutil.which('unshare') is None else None
    if why is None:
        p = subprocess.run(['unshare', '-rm', 'mount', '-t', 'tmpfs', 'none', str(folder)],
                           capture_output=True, text=True)
        why = p.returncode and f'no tmpfs in a mount namespace here: {p.stderr.strip()}'
    if why:
        print(f'skipped: {why}')
        pytest.skip(why)

def apex3_on_tmpfs(folder, opts, *argv, branch='on'):
    "`apex3 *argv` with a fresh tmpfs (mount options `opts`) over `folder`, in a mount namespace of its own."
    env = {**os.environ, 'PYTHONPATH': str(ROOT)}
    return subprocess.run(['unshare', '-rm', 'sh', '-c', MOUNT, opts, str(folder), sys.executable, '-c', APEX3, branch,
                           *argv], capture_output=True, text=True, env=env, timeout=120)

def _one_line(p, expected):
    assert (p.returncode, p.stderr) == (2, expected + '\n'), p.stderr[-3000:]

def test_read_only_folder_is_one_line(tmp_path):
    _namespaces_or_skip(tmp_path)
    out = tmp_path / 'out'
    _one_line(apex3_on_tmpfs(tmp_path, 'ro,size=1m', 'demo', '--out', out),
              f'apex3 demo: error: {out}: Read-only file system (EROFS)')
    control = apex3_on_tmpfs(tmp_path, 'ro,size=1m', 'demo', '--out', out, branch='off')
    assert control.returncode == 1 and 'Traceback' in control.stderr and 'EROFS' not in control.stderr
    assert os.listdir(tmp_path) == []   # it all happened on the namespace's own tmpfs

def test_full_folder_is_one_line(tmp_path):
    "`apex3 demo` writes its plots first: on a 64 KiB tmpfs the second one meets a full disk (a write names no file)."
    _namespaces_or_skip(tmp_path)
    _one_line(apex3_on_tmpfs(tmp_path, 'size=64k', 'demo', '--out', tmp_path / 'out'),
              'apex3 demo: error: No space left on device (ENOSPC)')
    control = apex3_on_tmpfs(tmp_path, 'size=64k', 'demo', '--out', tmp_path / 'out', branch='off')
    assert control.returncode == 1 and control.stderr.count('\n') > 3 and 'Traceback' in control.stderr

def test_agent_command_missing_parent_is_one_line(tmp_path):
    "An `apex3 agent` subcommand too: a demo whose --out has a file for a parent."
    (tmp_path / 'file').write_text('')
    p = subprocess.run([sys.executable, '-c', APEX3, 'on', 'agent', 'demo', '--out', tmp_path / 'file' / 'out'],
                       capture_output=True, text=True, env={**os.environ, 'PYTHONPATH': str(ROOT)}, timeout=120)
    _one_line(p, f'apex3 agent demo: error: {tmp_path}/file/out: Not a directory (ENOTDIR)')

def test_other_errors_keep_their_traceback():
    "An OSError that is not the file system's (no file named, not a storage errno) and any other exception: bugs."
    def refused(argv): raise ConnectionRefusedError(111, 'Connection refused')
    def bug(argv): raise KeyError('a bug')
    for fn, kind in [(refused, ConnectionRefusedError), (bug, KeyError)]:
        with pytest.raises(kind): run_command('x', fn, [])

def test_newline_in_an_argument_is_one_line():
    p = subprocess.run([sys.executable, '-c', APEX3, 'on', 'plan', '70B', 'x\ny'], capture_output=True, text=True,
                       env={**os.environ, 'PYTHONPATH': str(ROOT)}, timeout=120)
    _one_line(p, "apex3 plan: error: unrecognized arguments: 'x\\ny'")

def _stderr_of(fn):
    import contextlib, io
    err = io.StringIO()
    with contextlib.redirect_stderr(err): rc = run_command('x', fn, [])
    return rc, err.getvalue()

def _one_printable_line(rc, err):
    assert rc == 2 and err.endswith('\n') and err.count('\n') == 1 and err[:-1].isprintable(), repr(err)

# a closed pipe (Python makes EPIPE and ESHUTDOWN a BrokenPipeError) ends quietly with status 141 instead
CLOSED_PIPE = {c for c in errno.errorcode if isinstance(OSError(c, 'x'), BrokenPipeError)}

@settings(max_examples=150, deadline=None)
@given(st.text(), st.text(), st.sampled_from(sorted(set(errno.errorcode) - CLOSED_PIPE)))
def test_every_refusal_is_one_printable_line(message, filename, code):
    "Any text in a UsageError, any file name in an OSError: one line on stderr, nothing a terminal would act on."
    def usage(argv): raise UsageError(message)
    def fs(argv): raise OSError(code, os.strerror(code), filename)
    _one_printable_line(*_stderr_of(usage))
    rc, err = _stderr_of(fs)
    _one_printable_line(rc, err)
    assert err.endswith(f' ({errno.errorcode[code]})\n')
    shown = filename if _as_typed(filename) else _escaped(repr(filename))   # as typed, or quoted
    assert err.startswith(f'apex3 x: error: {shown}: ')

@settings(max_examples=150, deadline=None)
@given(st.lists(st.text(min_size=1).filter(lambda a: not a.startswith('-')), min_size=1, max_size=4))
def test_unrecognized_arguments_are_one_line_each_shown_whole(extra):
    "Arguments a parser does not take: one line, each argument either as typed or quoted whole (never cut)."
    p = ArgParser(prog='x')
    def parse(argv): p.parse_args(extra)
    rc, err = _stderr_of(parse)
    _one_printable_line(rc, err)
    shown = ' '.join(a if _as_typed(a) else _escaped(repr(a)) for a in extra)
    assert err == f'apex3 x: error: unrecognized arguments: {shown}\n'

def _as_typed(text):
    "The reference: a name is shown as typed when a reader sees all of it (not empty, printable, no edge spaces)."
    return bool(text) and text.isprintable() and not text[0].isspace() and not text[-1].isspace()

def _escaped(text):
    "The reference: what a line keeps of `text`, every unprintable character written as Python writes it."
    return ''.join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def test_an_output_folder_that_is_a_file_says_so(tmp_path):
    """`apex3 demo --out FILE` said "File exists (EEXIST)" of a path that exists as a file, where it means: not a folder.
    The control: a folder under that path's parent is made and written (`probe_writable` itself, as the demo calls it)."""
    from apex3.usage import probe_writable
    f = tmp_path/'notes.txt'
    f.write_text('mine')
    r = subprocess.run([sys.executable, '-c', APEX3, 'on', 'demo', '--out', str(f)], capture_output=True, text=True,
                       timeout=120)
    assert (r.returncode, r.stderr) == (2, f'apex3 demo: error: {f}: Not a directory (ENOTDIR)\n'), r.stderr
    assert f.read_text() == 'mine'
    probe_writable(tmp_path/'new'/'folder')
    assert (tmp_path/'new'/'folder').is_dir()
