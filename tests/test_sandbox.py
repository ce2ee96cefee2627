"The agent sandbox: the escape suite per backend (printed as N/N blocked), its controls, the workspace quota, the CLI."
import contextlib, errno, io, os, pathlib, shutil, signal, stat, subprocess, sys, tempfile, time
import pytest
from apex3.usage import UsageError, run_command
from apex3.agent.sandbox import BwrapSandbox, DockerSandbox, Limits, bwrap_argv, get_sandbox, docker_client
from apex3.agent.workspace import _plain, SANDBOX_UID, Workspace, sweep_orphans
from apex3.agent.escapes import (SUITE_LIMITS as SUITE, SUITE_ROWS, BAIT_VAR, NullSandbox, control_suite, escape_suite,
                                 escape_table, sandbox_main)

SUITE_LIMITS = Limits(**SUITE)
NEW_ROWS = ['host environment', 'ptrace outside', 'nested userns', 'disk fill', '/tmp, /dev/shm fill', 'open files']
root = os.geteuid() == 0
needs_root = pytest.mark.skipif(not root, reason='the workspace quota mounts a tmpfs, which needs root')
needs_bwrap = pytest.mark.skipif(shutil.which('bwrap') is None and not os.environ.get('CI'),
                                 reason='bubblewrap is not installed (tools/ci_agent_setup.sh installs it)')

def _docker_or_skip():
    try: docker_client()
    except UsageError as e:
        print(f'docker tests skipped: {e}')
        pytest.skip(str(e))

@needs_bwrap
def test_bwrap_escape_suite_from_the_cli():
    rc, out, err = _cli('--escape-suite')
    print('\n' + out)
    rows = out.strip().splitlines()
    assert len(rows) == len(SUITE_ROWS) + 1
    escaped = [line.split('  ')[0] for line in rows[:-1] if ' ESCAPED ' in line]
    assert escaped == ([] if root else ['memory, forked', 'disk fill'])  # the cgroups and the tmpfs need root
    n = len(SUITE_ROWS)
    assert rows[-1] == (f'bwrap: {n}/{n} blocked' if root else f'bwrap: {n - 2}/{n} blocked')
    assert rc == (0 if root else 1)

@needs_bwrap
def test_bwrap_controls_of_the_new_rows_escape():
    "Each new protection switched off alone lets its attack through: the rows can fail."
    rows = control_suite('bwrap', NEW_ROWS, SUITE_LIMITS)
    print('\n' + escape_table(rows, 'bwrap controls'))
    assert [r['attack'] for r in rows if r['blocked']] == ([] if root else ['disk fill'])

def test_suite_catches_a_null_sandbox():
    names = ['tcp egress', 'dns egress', 'read secret', 'symlink escape', '.. escape', 'host environment']
    with NullSandbox(Limits(wall_s=20)) as null: rows = escape_suite(null, names)
    print('\n' + escape_table(rows, 'none'))
    assert [r['attack'] for r in rows if r['blocked']] == []

def test_docker_escape_suite_and_its_controls():
    _docker_or_skip()
    with DockerSandbox(SUITE_LIMITS) as sb:
        r = sb.run(['sh', '-c', 'cat; echo e >&2; head -c 3000000 /dev/zero; exit 4'], stdin='x')
        assert (r.stdout[:1], r.stderr, r.exit_code, r.truncated) == ('x', 'e\n', 4, True)
        assert len(r.stdout) == sb.limits.output_bytes
        rows = escape_suite(sb, NEW_ROWS)  # the whole suite runs on Docker in chapter 62 itself
    print('\n' + escape_table(rows, 'docker'))
    assert [r['attack'] for r in rows if not r['blocked']] == ([] if root else ['disk fill'])
    controls = control_suite('docker', NEW_ROWS, SUITE_LIMITS)
    print('\n' + escape_table(controls, 'docker controls'))
    assert [r['attack'] for r in controls if r['blocked']] == ([] if root else ['disk fill'])

LIMIT_LINES = ['Max cpu time', 'Max file size', 'Max core file size', 'Max open files', 'Max address space']

def _limits(sb):
    lines = sb.run(['cat', '/proc/self/limits']).stdout.splitlines()
    return {l[:26].strip(): l[26:].split()[:2] for l in lines if l[:26].strip() in LIMIT_LINES}

@needs_bwrap
def test_both_backends_set_the_same_rlimits():
    _docker_or_skip()
    limits = Limits(memory_mb=300, cpu_s=7, fsize_mb=5, nofile=100, wall_s=20)
    with BwrapSandbox(limits) as bw, DockerSandbox(limits) as dk: inside = [_limits(bw), _limits(dk)]
    assert inside[0] == inside[1] == {'Max cpu time': ['7', '8'], 'Max file size': [str(5 << 20)] * 2,
                                      'Max core file size': ['0', '0'], 'Max open files': ['100', '100'],
                                      'Max address space': [str(300 << 20)] * 2}

@needs_bwrap
def test_python_tool_never_sees_the_host_environment(monkeypatch):
    "The agent's `python` tool through the default runner: no /proc file inside holds the caller's variables."
    from apex3.agent.tools import get_runner, python_tool
    monkeypatch.setenv(BAIT_VAR, 'sk-planted-4242')
    code = ("import glob\nfor p in glob.glob('/proc/*/environ') + glob.glob('/proc/*/cmdline'):\n"
            "    try: print(open(p, 'rb').read())\n    except OSError: pass")
    runner = get_runner(wall_s=20)
    assert isinstance(runner, BwrapSandbox)
    out = python_tool(runner).fn(dict(code=code))
    assert "b'" in out and 'sk-planted-4242' not in out
    with BwrapSandbox(Limits(wall_s=20), without={'clean env'}) as leaky:  # the control: the probe finds it there
        assert 'sk-planted-4242' in python_tool(leaky).fn(dict(code=code))

@needs_bwrap
@needs_root
def test_workspace_quota_holds_across_runs_and_a_named_folder():
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, 'keep.txt'), 'w') as f: f.write('mine')
        with get_sandbox(wall_s=20, disk_mb=4, workdir=d) as sb:
            fill = 'for i in 1 2 3 4 5 6; do head -c 1000000 /dev/zero > "f$0-$i" || exit 1; done'
            assert [sb.run(['sh', '-c', fill, str(run)]).exit_code for run in range(2)] == [1, 1]
            used = shutil.disk_usage(sb.workdir)
            assert used.total <= 4 << 20 and used.free < 1 << 20
        assert os.path.exists(os.path.join(d, 'keep.txt'))  # what the folder held comes back with the new files
        assert sum(os.path.getsize(os.path.join(d, n)) for n in os.listdir(d)) <= 4 << 20
    big = tempfile.mkdtemp()
    try:
        with open(os.path.join(big, 'big'), 'wb') as f: f.write(b'x' * (2 << 20))
        with pytest.raises(UsageError, match='more than the workspace quota'): get_sandbox(disk_mb=1, workdir=big)
        assert os.path.getsize(os.path.join(big, 'big')) == 2 << 20  # refused, and nothing lost
    finally: shutil.rmtree(big)

@needs_root
def test_copy_back_never_follows_a_link():
    "A link the sandbox leaves in a named folder to a host file is not followed, nor copied back: the file is intact."
    with tempfile.TemporaryDirectory() as d, tempfile.NamedTemporaryFile('w', delete=False) as host:
        host.write('host data')
        host.close()
        ws = Workspace(d, disk_mb=4)
        os.symlink(host.name, os.path.join(ws.path, 'evil'))
        os.mkfifo(os.path.join(ws.path, 'pipe'))
        ws.close()
        assert not os.path.lexists(os.path.join(d, 'evil')) and not os.path.exists(os.path.join(d, 'pipe'))
        assert open(host.name).read() == 'host data'
        os.unlink(host.name)

def test_bwrap_argv_carries_each_protection_and_without_drops_it():
    on, off = bwrap_argv('/tmp/ws'), bwrap_argv('/tmp/ws', without={'clean env', 'pid 1', 'userns block', 'tmp size'})
    for flag in ['--clearenv', '--as-pid-1', '--disable-userns', '--size']:
        assert flag in on and flag not in off
    assert on[on.index('--bind') + 1:on.index('--bind') + 3] == ['/tmp/ws', '/workspace']
    with pytest.raises(UsageError, match='unknown sandbox protections'): BwrapSandbox(without={'seatbelt'})

@needs_bwrap
def test_workspace_persists_and_is_the_only_writable_place():
    with get_sandbox(wall_s=10) as sb:
        assert sb.run(['sh', '-c', 'echo 1 > a']).ok
        assert sb.run(['cat', 'a']).stdout == '1\n'
        assert not sb.run(['sh', '-c', 'echo 1 > /usr/a']).ok
        r = sb.run(['sh', '-c', 'head -c 5000000 /dev/zero | tr "\\0" x'])
        assert r.truncated and len(r.stdout) == sb.limits.output_bytes
    assert not os.path.exists(sb.workdir)  # a sandbox's own workspace goes with it

def _cli(*argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = run_command('agent sandbox', sandbox_main, list(argv))
    return rc, out.getvalue(), err.getvalue()

@needs_bwrap
def test_cli_runs_a_command():
    with tempfile.TemporaryDirectory() as d:
        rc, out, err = _cli('--workdir', d, '--disk', '16', '--', 'sh', '-c', 'echo hello > f; cat f; exit 3')
        assert (rc, out) == (3, 'hello\n') and '[sandbox bwrap] exit 3' in err
        assert open(os.path.join(d, 'f')).read() == 'hello\n'

@pytest.mark.parametrize('argv', [[], ['true'], ['--memory', 'lots', '--', 'true'], ['--backend', 'vm', '--', 'true'],
                                  ['--disk', '0', '--', 'true'], ['--workdir', '/nonexistent/dir', '--', 'true'],
                                  ['--']])
def test_cli_bad_input_is_one_line(argv):
    rc, out, err = _cli(*argv)
    assert rc == 2 and len(err.strip().splitlines()) == 1 and err.startswith('apex3 agent sandbox: error:')

APEX3 = [sys.executable, '-c', 'import sys; from apex3.cli import main; sys.exit(main())']

def _workspaces_of(pid):
    "The host mounts of the workspaces process `pid` made (their folder names it: `apex3-ws-PID-`)."
    with open('/proc/self/mounts') as f: return [l.split()[1] for l in f if f'/apex3-ws-{pid}-' in l]

def _signalled_mid_run(sig):
    "(status, stderr, workspaces left mounted) of `apex3 agent sandbox -- sleep 30` sent `sig` once its tmpfs is up."
    p = subprocess.Popen([*APEX3, 'agent', 'sandbox', '--', 'sleep', '30'], stderr=subprocess.PIPE, text=True,
                         env={**os.environ, 'PYTHONPATH': str(pathlib.Path(__file__).parents[1])})
    end = time.monotonic() + 30
    while not _workspaces_of(p.pid) and time.monotonic() < end and p.poll() is None: time.sleep(0.05)
    assert _workspaces_of(p.pid), 'the workspace was never mounted'
    time.sleep(0.5)   # the command is running in the sandbox
    p.send_signal(sig)
    return p.wait(timeout=30), p.stderr.read(), _workspaces_of(p.pid)

@needs_bwrap
@needs_root
def test_sigterm_unmounts_the_workspace_as_ctrl_c_does():
    rc, err, left = _signalled_mid_run(signal.SIGTERM)
    assert (rc, err, left) == (143, 'apex3 agent sandbox: terminated\n', [])
    rc, err, left = _signalled_mid_run(signal.SIGINT)
    assert (rc, err.splitlines()[-1], left) == (130, 'apex3 agent sandbox: interrupted', [])
    rc, _, left = _signalled_mid_run(signal.SIGKILL)   # the control: no clean-up runs, the mount stays
    try: assert rc == -signal.SIGKILL and len(left) == 1
    finally: sweep_orphans()   # what the next sandbox run would do

def test_missing_backend_is_a_usage_error():
    with pytest.raises(UsageError, match='bubblewrap is not installed'): BwrapSandbox(bwrap='/nonexistent/bwrap')
    with pytest.raises(UsageError, match='unknown sandbox backend'): get_sandbox('lxc')

# --- the copy back of a named folder: all or nothing, judged from the host -----------------------------------------

def _mounted(folder): return any(line.split()[1] == folder for line in open('/proc/self/mounts'))

def _listing(folder):
    return {os.path.relpath(os.path.join(t, n), folder) for t, ds, fs in os.walk(folder) for n in ds + fs}

@contextlib.contextmanager
def _small_disk(kb, keep=None):
    """A fresh folder that is a tmpfs of `kb` KiB, holding keep.txt with the text `keep` if given; unmounted and removed
    after; skipped (reason printed) if not here."""
    d = tempfile.mkdtemp()
    p = subprocess.run(['mount', '-t', 'tmpfs', '-o', f'size={kb}k', 'apex3-test', d], capture_output=True, text=True)
    try:
        if p.returncode:
            print(f'skipped: no tmpfs here ({p.stderr.strip()})')
            pytest.skip(f'no tmpfs here: {p.stderr.strip()}')
        if keep is not None:
            with open(os.path.join(d, 'keep.txt'), 'w') as f: f.write(keep)
        yield d
    finally:
        if not p.returncode: subprocess.run(['umount', d], check=True)
        os.rmdir(d)

def _clear_then_copy(src, dst):
    "The control: the order the copy back must not take, empty the named folder and then copy into it."
    for e in os.scandir(dst):
        if e.is_dir(follow_symlinks=False): shutil.rmtree(e.path)
        elif stat.S_ISREG(e.stat(follow_symlinks=False).st_mode) or e.is_symlink(): os.unlink(e.path)
    shutil.copytree(src, dst, symlinks=True, dirs_exist_ok=True)

def _control(folder, make):
    "`_clear_then_copy` of a workspace on `folder` in which `make(path)` did the run's work: what it raised."
    ws = Workspace(folder, disk_mb=8)
    make(ws.path)
    try: _clear_then_copy(ws.path, folder)
    except OSError as e: return e
    finally:
        ws.copied_in = False   # the control has copied back already
        ws.close()

def _gone(ws): return not os.path.exists(ws.path) and not _mounted(ws.path)

def _result_in_p(path):
    os.mkdir(os.path.join(path, 'p'))
    with open(os.path.join(path, 'p', 'result.txt'), 'w') as f: f.write('work\n')

@needs_bwrap
@needs_root
def test_a_fifo_gives_way_to_the_sandboxs_folder(tmp_path, caplog):
    "The named folder holds a fifo `p`; the command makes a folder `p` with its result: the result comes back."
    (tmp_path / 'keep.txt').write_text('mine')
    os.mkfifo(tmp_path / 'p')
    sb = get_sandbox(wall_s=20, disk_mb=8, workdir=str(tmp_path))
    assert sb.run(['sh', '-c', 'mkdir p && echo work > p/result.txt']).ok
    sb.close()
    assert (tmp_path / 'p' / 'result.txt').read_text() == 'work\n' and (tmp_path / 'keep.txt').read_text() == 'mine'
    assert _listing(tmp_path) == {'keep.txt', 'p', 'p/result.txt'} and _gone(sb.workspace)
    assert [r.getMessage() for r in caplog.records if 'replaces it' in r.getMessage()] == \
        [f'sandbox workdir: {tmp_path}/p is not a file or a folder; the sandbox made its own p, which replaces it']
    shutil.rmtree(tmp_path / 'p')
    os.mkfifo(tmp_path / 'p')   # the control: the old order raises shutil.Error, and the result is lost
    assert isinstance(_control(str(tmp_path), _result_in_p), shutil.Error)
    assert _listing(tmp_path) == {'keep.txt', 'p'} and stat.S_ISFIFO(os.lstat(tmp_path / 'p').st_mode)

@needs_root
def test_a_fifo_the_sandbox_never_touched_stays(tmp_path):
    "A socket or fifo of the named folder that the sandbox made nothing in place of is left where it is."
    os.mkfifo(tmp_path / 'pipe')
    ws = Workspace(str(tmp_path), disk_mb=4)
    with open(os.path.join(ws.path, 'new.txt'), 'w') as f: f.write('new')
    ws.close()
    assert _listing(tmp_path) == {'pipe', 'new.txt'} and stat.S_ISFIFO(os.lstat(tmp_path / 'pipe').st_mode)

BIG = 'head -c 300000 /dev/zero > a; head -c 900000 /dev/zero > b; ln -s a link; rm keep.txt'

@needs_bwrap
@needs_root
def test_a_full_disk_during_copy_back_leaves_the_folder_as_it_was(monkeypatch):
    """1.2 MB back into a 1 MiB folder: one line naming the file and ENOSPC, status 2, the folder as before the run, and
    no workspace left behind (made in a temporary folder of this test's own, which the sandbox's uid can pass through:
    other tests make theirs meanwhile)."""
    private = tempfile.mkdtemp(prefix='apex3-test-tmp-')
    os.chmod(private, 0o755)
    monkeypatch.setattr(tempfile, 'tempdir', private)
    with _small_disk(1024, keep='mine') as full:
        before = set(os.listdir(private))
        rc, out, err = _cli('--workdir', full, '--disk', '8', '--', 'sh', '-c', BIG + '; echo done')
        assert (rc, out) == (2, 'done\n')   # the command's output is shown before the copy back
        status, line = err.strip().splitlines()
        assert status.startswith('[sandbox bwrap] exit 0')
        stopped_at = 'b' if line.endswith(f'{full}/b: No space left on device (ENOSPC)') else 'a'  # the second copied
        assert line == (f'apex3 agent sandbox: error: sandbox workdir {full} is left as it was before the run: '
                        f'copying the workspace back failed: {full}/{stopped_at}: No space left on device (ENOSPC)')
        assert _listing(full) == {'keep.txt'} and open(os.path.join(full, 'keep.txt')).read() == 'mine'
        left = [n for n in set(os.listdir(private)) - before if n.startswith('apex3-ws-')]
        assert left == [] and not any('apex3-workspace' in l and full in l for l in open('/proc/self/mounts'))
        assert isinstance(_control(full, _fill), shutil.Error)   # the control: the old order loses keep.txt
        assert 'keep.txt' not in _listing(full)
    os.rmdir(private)   # empty: nothing of the run or of the test's disk stayed

def _fill(path):
    "What BIG does, done from the host."
    for name, n in [('a', 300000), ('b', 900000)]:
        with open(os.path.join(path, name), 'wb') as f: f.write(bytes(n))
    os.unlink(os.path.join(path, 'keep.txt'))

@needs_bwrap
@needs_root
def test_with_room_the_run_comes_back_links_as_links():
    "The control of the full disk: the same run into 4 MiB takes the run's files, the link as a link."
    with _small_disk(4096, keep='mine') as room:
        sb = get_sandbox(wall_s=20, disk_mb=8, workdir=room)
        assert sb.run(['sh', '-c', BIG]).ok
        sb.close()
        assert _listing(room) == {'a', 'b', 'link'} and os.path.getsize(os.path.join(room, 'b')) == 900000
        assert os.readlink(os.path.join(room, 'link')) == 'a' and _gone(sb.workspace)

@needs_root
def test_a_failed_swap_is_undone(tmp_path, monkeypatch):
    "A rename that fails halfway through moving the run's entries in: every rename so far is undone."
    (tmp_path / 'old1').write_text('1')
    (tmp_path / 'old2').write_text('2')
    ws = Workspace(str(tmp_path), disk_mb=4)
    for n in ('new1', 'new2', 'new3'):
        with open(os.path.join(ws.path, n), 'w') as f: f.write(n)
    real, calls = os.rename, []
    def flaky(src, dst, **dir_fds):
        calls.append(dst)
        if len(calls) == 4: raise OSError(errno.EIO, os.strerror(errno.EIO), src)   # the second move in
        return real(src, dst, **dir_fds)
    monkeypatch.setattr(os, 'rename', flaky)
    with pytest.raises(UsageError, match=r'is left as it was before the run: .*Input/output error \(EIO\)$'): ws.close()
    monkeypatch.undo()
    assert _listing(tmp_path) == {'old1', 'old2'} and (tmp_path / 'old1').read_text() == '1'
    assert _gone(ws) and len(calls) == 4 + 3   # four tried, then the three that succeeded undone

@needs_bwrap
def test_copy_back_drops_setuid_setgid_and_sticky_bits():
    """What the sandboxed code marks setuid, setgid or sticky in a named folder comes back without those bits: a root
    copy of a setuid program would run as root for anyone (the control: inside, the bits were set)."""
    with tempfile.TemporaryDirectory() as d:
        rc, out, err = _cli('--workdir', d, '--disk', '16', '--', 'sh', '-c',
                            'cp /bin/cat u && chmod 4755 u && cp /bin/cat g && chmod 2755 g && mkdir t && '
                            'chmod 1777 t && stat -c %a u g t')
        assert rc == 0 and out.split() == ['4755', '2755', '1777'], (rc, out, err)
        assert {f: stat.S_IMODE(os.lstat(os.path.join(d, f)).st_mode) for f in 'ugt'} == \
               {'u': 0o755, 'g': 0o755, 't': 0o777}

def _special(folder, names):
    return {n: stat.S_IMODE(os.lstat(os.path.join(folder, n)).st_mode) & 0o7000 for n in names}

@needs_bwrap
def test_written_in_place_setuid_setgid_and_sticky_bits_go_too(open_folder):
    """Without the quota the sandbox writes in the named folder itself: a setuid copy of python3 it leaves there would
    let any local user act as the sandbox's uid; after close no file or folder of the run has those bits. The control:
    until close, the host's copy has them."""
    sb = BwrapSandbox(Limits(wall_s=20), workdir=str(open_folder), without={'disk quota'})
    r = sb.run(['sh', '-c', 'cp /usr/bin/python3 u && chmod 4755 u && cp u g && chmod 2755 g && mkdir t && '
                            'chmod 1777 t'])
    assert r.ok, r
    assert _special(open_folder, 'ugt') == {'u': 0o4000, 'g': 0o2000, 't': 0o1000}   # the control
    sb.close()
    assert _special(open_folder, 'ugt') == {'u': 0, 'g': 0, 't': 0}
    assert os.access(open_folder / 'u', os.X_OK) and (open_folder / 't').is_dir()   # the rest of the mode is kept

@needs_bwrap
def test_an_exit_status_above_the_signals_is_the_commands_own():
    "`exit 200` is status 200; a command killed by SIGKILL is -9 (bwrap reports both as numbers above 128)."
    with get_sandbox(wall_s=20) as sb:
        assert sb.run(['sh', '-c', 'exit 200']).exit_code == 200
        assert sb.run(['sh', '-c', 'sh -c "kill -9 \\$\\$"; exit $?']).exit_code == -9   # (not PID 1, which ignores it)

@needs_bwrap
def test_a_tree_deeper_than_the_recursion_limit_comes_back_and_goes_in_again():
    "A folder 1,200 deep (Python's recursion stops near 1,000) in a named folder: this run and the next both finish."
    d = tempfile.mkdtemp()
    try:
        deep = 'import os\nfor _ in range(1200): os.mkdir("a"); os.chdir("a")\nopen("leaf", "w").write("x")'
        assert _cli('--workdir', d, '--disk', '64', '--', 'python3', '-c', deep)[0] == 0
        rc, out, err = _cli('--workdir', d, '--disk', '64', '--', 'sh', '-c', 'echo again; find a -name leaf | wc -l')
        assert (rc, out) == (0, 'again\n1\n'), err[-500:]
    finally: subprocess.run(['rm', '-rf', d])   # shutil.rmtree recurses

def _alive_with(marker) -> list:
    out = []
    for p in os.listdir('/proc'):
        if p.isdigit():
            try: cmd = open(f'/proc/{p}/cmdline', 'rb').read()
            except OSError: continue
            if marker.encode() in cmd and b'sh\x00-c' not in cmd: out.append(int(p))
    return out

def test_the_unsandboxed_runner_ends_what_its_command_started():
    """`--unsandboxed`'s runner kills a timed-out command's whole session, as the sandbox does; the control: a plain
    `subprocess.run` with the same timeout leaves the background child running."""
    import uuid
    from apex3.agent.tools import SubprocessRunner
    def started(runner_run):
        marker = f'apex3-orphan-{uuid.uuid4().hex[:8]}'
        runner_run(['sh', '-c', f'python3 -c "import time; time.sleep(30)" {marker} & sleep 30'])
        time.sleep(0.5)
        return marker, _alive_with(marker)
    marker, left = started(lambda cmd: SubprocessRunner(timeout=1).run(cmd))
    assert left == [], left
    def plain(cmd):
        with contextlib.suppress(subprocess.TimeoutExpired): subprocess.run(cmd, timeout=1, capture_output=True)
    marker, left = started(plain)
    try: assert left, 'the control: a plain subprocess.run left nothing behind'
    finally:
        for pid in left: os.kill(pid, 9)

@needs_bwrap
def test_a_tiny_timeout_times_out_the_command_not_the_backend():
    "`--timeout 0.001` is the command's limit: it times out (exit 124), where it once said bwrap does not work here."
    rc, out, err = _cli('--timeout', '0.001', '--', 'sleep', '1')
    assert rc == 124 and 'does not work here' not in err, (rc, err)

# --- what a run leaves in a named folder that could lead a host tool elsewhere: links out, fifos, devices ----------

LEAVE = ('echo x > x; ln x hard; stat -c %h x; ln -s /etc/shadow out; ln -s /workspace/x abs; mkdir sub; '
         'ln -s .. sub/up; ln -s sub/up/.. esc; ln -s sub/../x ok; ln -s ok chain; ln -s up1 up2; ln -s up2 up1; '
         'mkfifo pipe; python3 -c "import socket; socket.socket(socket.AF_UNIX).bind(\'sock\')"')
OWN = {'python': '/usr/bin/python3', 'mine': 'x'}   # the folder's own links, one out of it (a venv's)

def _leads_outside(folder, own=()):
    "Paths under `folder` (none followed) that resolve outside it, less the folder's own links `own`."
    top = os.path.realpath(folder)
    return sorted(rel for rel in _listing(folder) if rel not in own
                  and os.path.commonpath([top, os.path.realpath(os.path.join(folder, rel))]) != top)

def _odd_files(folder):
    "Paths under `folder` that are not a folder, a regular file or a link: a fifo, socket or device."
    modes = {rel: os.lstat(os.path.join(folder, rel)).st_mode for rel in _listing(folder)}
    return sorted(r for r, m in modes.items() if not (stat.S_ISDIR(m) or stat.S_ISREG(m) or stat.S_ISLNK(m)))

@pytest.fixture
def open_folder():
    "A fresh folder under /tmp the sandbox's uid can reach (pytest's tmp_path is in a folder only root may enter)."
    d = tempfile.mkdtemp()
    yield pathlib.Path(d)
    shutil.rmtree(d)

@needs_bwrap
@needs_root
@pytest.mark.parametrize('without', [(), ('disk quota',)], ids=['copied back', 'written in place'])
def test_no_path_the_run_leaves_resolves_outside_the_folder(open_folder, caplog, without):
    """After a run that leaves links out of a named folder (`/etc/shadow`, `..` through another link, a loop), a hard
    link, a fifo, a socket and a device: no path in the folder resolves outside it but its own link out, and none is a
    fifo, socket or device; a copy back makes the hard link a file of its own. Links that stay inside come back as
    links. The control: the run's workspace copied as it was (links as links, `shutil.copytree`) has all of them."""
    folder = open_folder
    for name, target in OWN.items(): os.symlink(target, folder / name)
    sb = BwrapSandbox(Limits(wall_s=20, disk_mb=8), workdir=str(folder), without=without)
    r = sb.run(['sh', '-c', LEAVE])
    assert r.ok and r.stdout == '2\n', r   # inside, x and hard are one file
    os.mknod(os.path.join(sb.workdir, 'dev'), stat.S_IFCHR | 0o600, os.makedev(1, 3))   # (no CAP_MKNOD inside)
    control = tempfile.mkdtemp()
    shutil.copytree(sb.workdir, control, symlinks=True, dirs_exist_ok=True, ignore=lambda d, names: [
        n for n in names if not _plain(os.path.join(d, n))])   # copytree cannot copy a fifo, socket or device
    sb.close()
    try: assert _leads_outside(control, OWN) == ['abs', 'esc', 'out']   # the control fails the check
    finally: shutil.rmtree(control)
    assert _leads_outside(folder, OWN) == [] and _odd_files(folder) == []
    assert {n: os.readlink(folder / n) for n in ['ok', 'chain', 'sub/up', *OWN]} == \
        {'ok': 'sub/../x', 'chain': 'ok', 'sub/up': '..', **OWN}
    if 'disk quota' not in without: assert os.lstat(folder / 'hard').st_nlink == 1
    lines = [r.getMessage() for r in caplog.records if str(folder) in r.getMessage()]
    assert len(lines) == (1 if without == () else 2) and 'link(s) the run left resolve outside it' in lines[0], lines

CHAINED_LINKS = ('mkdir d; p=d; for i in $(seq 200); do '
                 't=$(printf "d/../%.0s" $(seq 400))$p; ln -s "$t" l$i; p=l$i; done')
UNBOUNDED_WALK = ('import os, sys\n'
                  'from apex3.agent.workspace import _walk_link\n'
                  'top = sys.argv[1]\n'
                  'for n in sorted(os.listdir(top)):\n'
                  '    if n.startswith("l"): _walk_link(top, n, top, {}, budget=[10**12])\n')

@needs_bwrap
@needs_root
def test_links_chained_without_end_do_not_hold_the_copy_back(open_folder, caplog):
    """A run leaves 200 links, each a target of 800 parts (`d/../` 400 times) ending in the one before: walking every
    chain to its 40 hops is millions of path parts. The copy back takes under 3 s, leaves no path resolving outside
    the folder, and its warning says that links past the check's budget were dropped. The control: the same walk
    without a budget, in a process of its own, is still walking when those 3 s are up."""
    sb = BwrapSandbox(Limits(wall_s=60, disk_mb=64), workdir=str(open_folder))
    assert sb.run(['sh', '-c', CHAINED_LINKS]).ok
    tree = tempfile.mkdtemp()
    shutil.copytree(sb.workdir, tree, symlinks=True, dirs_exist_ok=True)
    t0 = time.monotonic()
    sb.close()
    assert time.monotonic() - t0 < 3
    assert _leads_outside(open_folder) == []
    assert any('past what the check walks' in r.getMessage() for r in caplog.records)
    walk = subprocess.Popen([sys.executable, '-c', UNBOUNDED_WALK, tree])
    try:
        with pytest.raises(subprocess.TimeoutExpired): walk.wait(timeout=3)   # the control: still walking
    finally:
        walk.kill(); walk.wait(); shutil.rmtree(tree)

FORGED = ('bad\nname', '/etc/x\n\x1b[31msandbox workdir /home: a forged line')   # a link's name and target

@needs_bwrap
@needs_root
@pytest.mark.parametrize('without', [(), ('disk quota',)], ids=['copied back', 'written in place'])
def test_a_dropped_links_warning_is_one_line_whatever_the_link_holds(open_folder, caplog, without):
    """A run leaves a link out of the folder whose name and target hold a newline and an escape sequence: the link
    is dropped with one warning line, the name and target shown escaped. The control: the link as the run left it
    holds both characters, which printed raw would start a line of the run's choosing."""
    name, target = FORGED
    sb = BwrapSandbox(Limits(wall_s=20, disk_mb=8), workdir=str(open_folder), without=without)
    assert sb.run(['ln', '-s', target, name]).ok
    left = os.readlink(os.path.join(sb.workdir, name))
    sb.close()
    assert '\n' in left and '\x1b' in left   # the control
    assert not os.path.lexists(open_folder / name)
    lines = [r.getMessage() for r in caplog.records if str(open_folder) in r.getMessage()]
    assert len(lines) == 1 and '\n' not in lines[0] and '\x1b' not in lines[0], lines
    assert lines[0].endswith(f'(the first: {name!r} -> {target!r})'), lines

@needs_bwrap
@needs_root
def test_a_folder_written_in_place_goes_back_to_its_owner(open_folder):
    """As root without the quota, the named folder is lent to the sandbox's uid for the run: after close the folder and
    what the run wrote in it are its owner's again (uid and gid), a file that was there stays as it was, and a file
    with a hard link outside the folder is not chowned through it. The control: until close, the host sees the folder
    and the run's files as the sandbox uid's."""
    owner, folder = (1234, 2345), open_folder
    os.chown(folder, *owner)
    (folder / 'before').write_text('x')   # root's
    fd, outside = tempfile.mkstemp()   # the sandbox uid's file on the same disk, hard linked in below
    os.close(fd)
    os.chown(outside, SANDBOX_UID, SANDBOX_UID)
    try:
        sb = BwrapSandbox(Limits(wall_s=20), workdir=str(folder), without={'disk quota'})
        assert sb.run(['sh', '-c', 'echo hi > new && mkdir d && echo x > d/f && ln new hl']).ok
        os.link(outside, folder / 'linked')
        owners = lambda names: {n: (os.lstat(folder / n).st_uid, os.lstat(folder / n).st_gid) for n in names}
        ran = ['.', 'new', 'd', 'd/f', 'hl']
        assert owners(ran) == {n: (SANDBOX_UID, SANDBOX_UID) for n in ran}   # the control
        sb.close()
        assert owners(ran) == {n: owner for n in ran}
        assert owners(['before']) == {'before': (0, 0)} and os.stat(outside).st_uid == SANDBOX_UID
    finally: os.unlink(outside)

@needs_bwrap
@needs_root
def test_a_folder_swapped_for_a_link_is_not_given_back_through(open_folder, monkeypatch):
    """The folder is given back by descriptor: a folder of the run that another process as the sandbox's uid swaps for
    a link to elsewhere while it is given back is not entered, and the file there keeps its owner. The control: a
    chown by path after the same swap reaches that file through the link."""
    from apex3.agent import workspace as sbm
    owner, folder, elsewhere = (1234, 2345), open_folder, pathlib.Path(tempfile.mkdtemp())
    os.chown(folder, *owner)
    try:
        (elsewhere / 'f').write_text('x')
        os.chown(elsewhere / 'f', SANDBOX_UID, SANDBOX_UID)
        sb = BwrapSandbox(Limits(wall_s=20), workdir=str(folder), without={'disk quota'})
        assert sb.run(['sh', '-c', 'mkdir d && echo x > d/f']).ok
        walks, below = [], sbm._below
        def swapping(top):   # the tidy, the count of names, the chown: before the chown, d becomes a link elsewhere
            walks.append(top)
            if len(walks) == 3:
                shutil.rmtree(folder / 'd')
                os.symlink(elsewhere, folder / 'd')
            return below(top)
        monkeypatch.setattr(sbm, '_below', swapping)
        sb.close()
        assert len(walks) == 3 and os.stat(elsewhere / 'f').st_uid == SANDBOX_UID
        os.lchown(folder / 'd' / 'f', *owner)   # the control
        assert os.stat(elsewhere / 'f').st_uid == owner[0]
    finally: shutil.rmtree(elsewhere)

@needs_bwrap
@needs_root
def test_a_folder_swapped_for_a_link_is_not_tidied_through(open_folder, monkeypatch):
    """A link the run leaves out of the folder is removed where it is, by descriptor: its folder swapped meanwhile for
    a link to elsewhere, root does not remove the file of that name there. The control: a removal by path after the
    same swap does."""
    from apex3.agent import workspace as sbm
    folder, elsewhere = open_folder, pathlib.Path(tempfile.mkdtemp())
    try:
        (elsewhere / 'out').write_text('the host keeps this')
        sb = BwrapSandbox(Limits(wall_s=20), workdir=str(folder), without={'disk quota'})
        assert sb.run(['sh', '-c', 'mkdir d && ln -s /etc/shadow d/out']).ok
        below = sbm._below
        def swapping(top):   # once d/out is found, d becomes a link to elsewhere before it is removed
            for entry in below(top):   # (descriptor, name, path, lstat)
                if entry[2] == 'd/out' and not (folder / 'd').is_symlink():
                    os.rename(folder / 'd', folder / 'd.moved')
                    os.symlink(elsewhere, folder / 'd')
                yield entry
        monkeypatch.setattr(sbm, '_below', swapping)
        sb.close()
        assert (elsewhere / 'out').read_text() == 'the host keeps this'
        assert not os.path.lexists(folder / 'd.moved' / 'out')   # the link the run left is gone from where it was
        os.unlink(folder / 'd' / 'out')   # the control: a path is resolved through the link
        assert not (elsewhere / 'out').exists()
    finally: shutil.rmtree(elsewhere)

DEPTH, NAME = 200, 'd' * 30   # folders the run nests: past the 64 files the closing process may hold, and PATH_MAX
NEST = ('import os\nfor _ in range(%d): os.mkdir("%s"); os.chdir("%s")\n'
        'os.symlink("/etc/shadow", "out"); open("u", "w").close(); os.chmod("u", 0o4755)' % (DEPTH, NAME, NAME))
CLOSE_WITH_FEW_FILES = ('import resource, sys\n'
                        'from apex3.agent import sandbox as sbm, workspace\n'
                        'folder, levels = sys.argv[1], int(sys.argv[2])\n'
                        'workspace.OPEN_LEVELS = levels\n'
                        'sb = sbm.BwrapSandbox(sbm.Limits(wall_s=20), workdir=folder, without={"disk quota"})\n'
                        'assert sb.run(["python3", "-c", sys.argv[3]]).ok\n'
                        'resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))\n'
                        'sb.close()\n')

def _bottom_after_close(folder, levels):
    """Run NEST in a sandbox written in place on `folder` (lent to the sandbox's uid) and close it with at most 64
    files open, in a process of its own: (the link's there, the setuid bit, (uid, gid)) of what the run left at the
    bottom, reached part by part (its path is too long for one call), and the closing process's stderr."""
    p = subprocess.run([sys.executable, '-c', CLOSE_WITH_FEW_FILES, str(folder), str(levels), NEST],
                       capture_output=True, text=True, timeout=120)
    bottom = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(DEPTH):
        below = os.open(NAME, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=bottom)
        os.close(bottom)
        bottom = below
    try:
        st = os.lstat('u', dir_fd=bottom)
        link = 'out' in os.listdir(bottom)
    finally: os.close(bottom)
    return (link, st.st_mode & 0o7000, (st.st_uid, st.st_gid)), p.stderr

@needs_bwrap
@needs_root
def test_a_tree_deeper_than_the_open_files_is_tidied_and_given_back_whole(open_folder):
    """A run nests folders 200 deep (a path of 6,000 characters, longer than one the kernel takes) in a named folder
    it writes in place and leaves a link to /etc/shadow and a setuid file in the last; the sandbox is closed by a
    process that may hold 64 files open. After close the link is gone (a warning line names it as too deep to name),
    the file is plain and its owner's again (uid and gid). The control: the same close with a walk that holds a
    descriptor for every level stops at the limit, and all three stay as the run left them."""
    owner, control = (1234, 2345), pathlib.Path(tempfile.mkdtemp())
    try:
        for folder in (open_folder, control): os.chown(folder, *owner)
        left, err = _bottom_after_close(open_folder, 32)
        assert left == (False, 0, owner) and '(the first: (deeper than a path can name))' in err, err[-500:]
        left, err = _bottom_after_close(control, 10**6)
        assert left == (True, stat.S_ISUID, (SANDBOX_UID, SANDBOX_UID)), err[-500:]
        assert 'Too many open files' in err
    finally: subprocess.run(['rm', '-rf', control])

@needs_bwrap
@needs_root
def test_what_is_copied_back_is_the_named_folders_owners(open_folder):
    """With the quota, root copies the run's files back into the named folder: the file and the folder the command
    made, and what is in it, are the folder's owner's (uid and gid), whom root's files would leave unable to change
    them or empty the folder. The control: the workspace copied by root as the copy back did before it set an owner
    is root's."""
    owner, folder, control = (4242, 4343), open_folder, tempfile.mkdtemp()
    os.chown(folder, *owner)
    try:
        sb = BwrapSandbox(Limits(wall_s=20, disk_mb=8), workdir=str(folder))
        assert sb.run(['sh', '-c', 'echo x > f && mkdir d && echo y > d/g && ln -s f l']).ok
        shutil.copytree(sb.workdir, control, symlinks=True, dirs_exist_ok=True)   # the control
        sb.close()
        owners = lambda top, names: {n: (os.lstat(os.path.join(top, n)).st_uid, os.lstat(os.path.join(top, n)).st_gid)
                                     for n in names}
        assert owners(control, ['f', 'd']) == {'f': (0, 0), 'd': (0, 0)}
        assert owners(folder, ['f', 'd', 'd/g', 'l']) == {n: owner for n in ['f', 'd', 'd/g', 'l']}
    finally: shutil.rmtree(control)

@needs_bwrap
@needs_root
@pytest.mark.parametrize('quota', [True, False])
def test_a_workdir_named_through_a_link_is_the_folder_it_names(open_folder, tmp_path, quota):
    """A workdir given as a link to a folder (a home folder on another disk, say) is that folder: the run's file
    arrives in it, and it is given back to its owner, with the quota (copied back) and without (written in place).
    The control: the folder opened by the name given, without following a link, as every step after the first does,
    is refused."""
    from apex3.agent.workspace import _DIR_NOFOLLOW
    owner, folder, link = (4242, 4343), open_folder, tmp_path / 'link'
    os.chown(folder, *owner)
    link.symlink_to(folder)
    sb = BwrapSandbox(Limits(wall_s=20, disk_mb=8), workdir=str(link), without=() if quota else ('disk quota',))
    assert sb.run(['sh', '-c', 'echo x > f']).ok
    sb.close()
    f = pathlib.Path(folder, 'f')
    assert f.read_text() == 'x\n'
    assert {(st.st_uid, st.st_gid) for st in (os.lstat(folder), os.lstat(f))} == {owner}
    with pytest.raises(OSError) as e: os.open(link, _DIR_NOFOLLOW)
    assert e.value.errno in (errno.ELOOP, errno.ENOTDIR)   # (O_DIRECTORY: ENOTDIR)

@needs_bwrap
@needs_root
def test_the_workspace_is_read_only_while_it_is_copied_back(open_folder, monkeypatch):
    """A run that times out has its processes killed as its pid namespace ends, after `run` returns: one still alive
    while the copy back reads the workspace could change a link between the check that lets it come back and its
    copy. The workspace is made read-only first: that change, tried as the link is copied, fails (EROFS) and the link
    comes back as it was checked. The control: with the workspace left writable, the same change brings a link to
    /etc/shadow into the named folder."""
    from apex3.agent import workspace as sbm
    def retarget_in_copy_back(folder, freeze):
        "Close a run on `folder` that made `a` and the link `l` to it, retargeting `l` as it is copied: (what, target)."
        sb = BwrapSandbox(Limits(wall_s=20, disk_mb=8), workdir=str(folder))
        assert sb.run(['sh', '-c', 'echo x > a && ln -s a l']).ok
        changed, copy_link = [], sbm._copy_link
        def retargeting(src, dst, name, owner=None):
            if not changed:
                try:
                    os.unlink(os.path.join(sb.workdir, name))
                    os.symlink('/etc/shadow', os.path.join(sb.workdir, name))
                    changed.append('changed')
                except OSError as e: changed.append(errno.errorcode[e.errno])
            return copy_link(src, dst, name, owner)
        with monkeypatch.context() as m:
            m.setattr(sbm, '_copy_link', retargeting)
            if not freeze: m.setattr(sbm, '_freeze', lambda folder: None)
            sb.close()
        return changed, os.readlink(folder / 'l')
    control = pathlib.Path(tempfile.mkdtemp())
    try:
        assert retarget_in_copy_back(open_folder, True) == (['EROFS'], 'a')
        assert retarget_in_copy_back(control, False) == (['changed'], '/etc/shadow')   # the control
    finally: shutil.rmtree(control)

# --- the named folder's owner renames its entries while root copies in and back ----------------------------------

OWNER, SECRET = (4242, 4343), b'root only: never for uid 4242'

def _as_owner(act):
    "Run `act()` in a child process as the named folder's owner (uid 4242, gid 4343, no other group): whether it did."
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setgid(OWNER[1])
            os.setuid(OWNER[0])
            act()
            os._exit(0)
        except BaseException: os._exit(1)
    return os.waitpid(pid, 0)[1] == 0

def _swap_for_link(folder, name, target):
    "As the owner: the entry `name` of `folder` renamed `name.moved`, and a link to `target` put in its place."
    def swap():
        os.rename(os.path.join(folder, name), os.path.join(folder, name + '.moved'))
        os.symlink(target, os.path.join(folder, name))
    assert _as_owner(swap)

@pytest.fixture
def vault():
    "A fresh folder only root may enter (0700) holding the file `secret`."
    d = pathlib.Path(tempfile.mkdtemp())
    (d / 'secret').write_bytes(SECRET)
    yield d
    shutil.rmtree(d)

def _holding(folder, data):
    "Paths of the regular files under `folder` (no link followed) whose bytes hold `data`."
    files = [rel for rel in _listing(folder) if stat.S_ISREG(os.lstat(os.path.join(folder, rel)).st_mode)]
    return sorted(rel for rel in files if data in pathlib.Path(folder, rel).read_bytes())

@needs_root
def test_the_owner_cannot_turn_the_copy_back_into_a_root_only_folder(open_folder, vault, monkeypatch):
    """The named folder's owner, in a process of its own, swaps each hidden folder the copy back made in the named
    folder (the staging folder, and the one what the folder held moves aside to) for a link to a root-only folder as
    the first file is copied: nothing lands in the root-only folder, and the run's files come back, the owner's. The
    control: a copy by path into a staging folder after the same swap writes into the root-only folder."""
    from apex3.agent import workspace as sbm
    folder = open_folder
    os.chown(folder, *OWNER)
    ws = Workspace(str(folder), disk_mb=4)
    os.mkdir(os.path.join(ws.path, 'd'))
    for rel in ('f', 'd/g'): pathlib.Path(ws.path, rel).write_text('the run')
    staged, copy_file = [], sbm._copy_file
    def swapping(src, dst, name, *rest):
        if not staged:
            staged.extend(n for n in os.listdir(folder) if n.startswith(sbm.STAGING))
            for n in staged: _swap_for_link(folder, n, vault)
        return copy_file(src, dst, name, *rest)
    monkeypatch.setattr(sbm, '_copy_file', swapping)
    ws.close()
    assert len(staged) == 2 and os.listdir(vault) == ['secret']
    assert {n: os.lstat(folder / n).st_uid for n in ['f', 'd', 'd/g']} == dict.fromkeys(['f', 'd', 'd/g'], OWNER[0])
    assert (folder / 'd' / 'g').read_text() == 'the run'
    stage = tempfile.mkdtemp(prefix=sbm.STAGING, dir=folder)   # the control: the same swap, then a copy by path
    _swap_for_link(folder, os.path.basename(stage), vault)
    shutil.copytree(folder / 'd', stage, dirs_exist_ok=True)
    assert 'g' in os.listdir(vault)

@needs_root
def test_the_owner_cannot_turn_the_copy_in_to_a_root_only_folder(open_folder, vault, monkeypatch):
    """The named folder's owner, in a process of its own, swaps its folder `d` for a link to a root-only folder holding
    a secret after the copy in has listed `d` and before it goes in: no copy of the secret's bytes is in the workspace
    (read from the host) or comes back, and the root-only folder is as it was. The control: the same swap between a
    listing and a copy by path copies the secret."""
    from apex3.agent import workspace as sbm
    def lent(folder):
        (folder / 'd').mkdir()
        (folder / 'd' / 'f').write_text('mine')
        for p in (folder, folder / 'd', folder / 'd' / 'f'): os.chown(p, *OWNER)
    folder, control = open_folder, pathlib.Path(tempfile.mkdtemp())
    try:
        lent(folder)
        swapped, opened, open_folder_at = [], [], sbm._open_folder
        def swapping(name, dfd):   # the second time d is opened: the copy's (the first is the check of its entries)
            opened.append(name)
            if opened.count('d') == 2 and not swapped:
                _swap_for_link(folder, 'd', vault)
                swapped.append(name)
            return open_folder_at(name, dfd)
        with monkeypatch.context() as m:
            m.setattr(sbm, '_open_folder', swapping)
            ws = Workspace(str(folder), disk_mb=4)
        try: assert swapped == ['d'] and _holding(ws.path, SECRET) == [] and _holding(ws.path, b'mine') == []
        finally: ws.close()
        assert _holding(folder, SECRET) == [] and os.listdir(vault) == ['secret']
        lent(control)   # the control: the walk lists d as a folder, the swap, then d copied by its path
        listed = [e for e in os.scandir(control) if e.is_dir(follow_symlinks=False)]
        _swap_for_link(control, 'd', vault)
        copied = pathlib.Path(tempfile.mkdtemp())
        for e in listed: shutil.copytree(e.path, copied / e.name)
        try: assert _holding(copied, SECRET) == ['d/secret']
        finally: shutil.rmtree(copied)
    finally: shutil.rmtree(control)

# --- what the copy back writes on the host: holes stay holes, hard links are bounded by the quota -----------------

SPARSE = ('truncate -s 30M s1 s2 s3; printf data | dd of=s2 bs=1 seek=1000000 conv=notrunc 2>/dev/null; '
          'head -c 2097152 /dev/urandom > f')
LINKED = SPARSE + '; for i in $(seq 10); do ln f f$i; done'

def _blocks_mb(folder):
    "MiB of blocks the files under `folder` take (as `du`, a hard link counted once)."
    seen = {(os.lstat(folder).st_ino): os.lstat(folder).st_blocks}
    for t, ds, fs in os.walk(folder):
        for n in ds + fs:
            st = os.lstat(os.path.join(t, n))
            seen[st.st_ino] = st.st_blocks
    return sum(seen.values()) * 512 / (1 << 20)

def _sparse_tree(path):
    "What LINKED does, done from the host in `path`."
    for n in ('s1', 's2', 's3'): os.truncate(open(os.path.join(path, n), 'wb').name, 30 << 20)
    with open(os.path.join(path, 's2'), 'r+b') as f: f.seek(1000000), f.write(b'data')
    pathlib.Path(path, 'f').write_bytes(os.urandom(2 << 20))
    for i in range(1, 11): os.link(os.path.join(path, 'f'), os.path.join(path, f'f{i}'))

@needs_bwrap
@needs_root
def test_sparse_files_come_back_sparse_and_hard_links_stay_within_the_quota(open_folder):
    """--disk 8: three sparse files of 30 MiB and a 2 MiB file come back sparse, with the same bytes, in no more than
    8 MiB of blocks; the same run with ten hard links to the 2 MiB file (22 MiB once copied as files) is refused in one
    line, status 2, the folder as it was. The control: the plain copy (sendfile, a hard link a file) of the same tree
    takes over 100 MiB of blocks. The sparse files go in again as they came back, in the workspace's 8 MiB."""
    folder = str(open_folder)
    pathlib.Path(folder, 'keep.txt').write_text('mine')
    rc, out, err = _cli('--workdir', folder, '--disk', '8', '--', 'sh', '-c', LINKED)
    line = err.strip().splitlines()[-1]
    assert rc == 2 and line == (f'apex3 agent sandbox: error: sandbox workdir {folder} is left as it was before the '
                                "run: the run's files would take more than the --disk quota of 8 MiB on the host "
                                '(hard links are copied as files)'), err
    assert _listing(folder) == {'keep.txt'} and pathlib.Path(folder, 'keep.txt').read_text() == 'mine'
    rc, out, err = _cli('--workdir', folder, '--disk', '8', '--', 'sh', '-c', SPARSE)
    assert rc == 0, err
    assert _listing(folder) == {'keep.txt', 's1', 's2', 's3', 'f'} and _blocks_mb(folder) <= 8
    expected = bytearray(30 << 20)
    expected[1000000:1000004] = b'data'
    for n in ('s1', 's2', 's3'):
        st = os.lstat(os.path.join(folder, n))
        assert st.st_size == 30 << 20 and st.st_blocks * 512 < 1 << 20
    assert pathlib.Path(folder, 's2').read_bytes() == expected
    assert pathlib.Path(folder, 's1').read_bytes() == bytes(30 << 20)
    ws, control = Workspace(folder, disk_mb=8), tempfile.mkdtemp()   # the control: the plain copy of the same tree
    try:
        for n in ('s1', 's2', 's3', 'f'): os.unlink(os.path.join(ws.path, n))
        _sparse_tree(ws.path)
        shutil.copytree(ws.path, control, dirs_exist_ok=True)
        assert _blocks_mb(control) > 100 and _blocks_mb(ws.path) <= 8
        with pytest.raises(UsageError, match='would take more than the --disk quota of 8 MiB'): ws.close()
    finally: shutil.rmtree(control)
    assert _listing(folder) == {'keep.txt', 's1', 's2', 's3', 'f'}

# --- what the named folder holds is checked before the copy in: its owner's only, no more than the inodes -----------

def _lend_with(folder, shape):
    """`folder` lent by OWNER, holding the owner's file `mine` and root's 0600 file at `shape` (`secret`, or
    `vault/secret` in a root 0700 folder)."""
    os.chown(folder, *OWNER)
    (folder / 'mine').write_text('mine')
    os.chown(folder / 'mine', *OWNER)
    if '/' in shape: os.mkdir(folder / 'vault', 0o700)
    (folder / shape).write_bytes(SECRET)
    os.chmod(folder / shape, 0o600)

@needs_bwrap
@needs_root
@pytest.mark.parametrize('shape', ['secret', 'vault/secret'])
def test_a_named_folder_holding_what_its_owner_does_not_own_is_refused(open_folder, monkeypatch, shape):
    """A folder lent by uid 4242 that holds root's 0600 file (or root's 0700 folder) is refused before the copy in:
    status 2, one line naming the first such entry and its owner, the sandbox never started, the file root's and the
    folder as it was. The control: without the check the sandbox reads the secret, and after the copy back the owner
    owns it."""
    from apex3.agent import workspace as sbm
    folder, first = open_folder, shape.split('/')[0]
    _lend_with(folder, shape)
    rc, out, err = _cli('--workdir', str(folder), '--disk', '8', '--', 'cat', shape)
    assert (rc, out, err.count('\n')) == (2, '', 1) and err == (
        f"apex3 agent sandbox: error: sandbox workdir {folder} holds '{first}', owned by uid 0, not by the folder's "
        f"owner (uid {OWNER[0]}): the sandbox would read it and the copy back would hand it to the folder's owner\n")
    assert _listing(folder) == {'mine', first, shape} and os.lstat(folder / shape).st_uid == 0
    monkeypatch.setattr(sbm, '_census', lambda top: (0, None))   # the control: the copy without the check
    sb = BwrapSandbox(Limits(wall_s=20, disk_mb=8), workdir=str(folder))
    assert sb.run(['cat', shape]).stdout == SECRET.decode()
    sb.close()
    assert os.lstat(folder / shape).st_uid == OWNER[0]

def _empty_files(folder, n):
    for i in range(n): open(os.path.join(folder, f'f{i}'), 'w').close()

@needs_root
def test_a_named_folder_with_more_entries_than_the_workspaces_inodes_is_refused(open_folder, monkeypatch):
    """--disk 8 gives the workspace 1024 inodes, one its top's: 1023 empty files go in, 1100 are refused in one line
    naming the count, the limit and --disk. The control: without the count the copy stops on ENOSPC naming a file."""
    from apex3.agent import workspace as sbm
    _empty_files(open_folder, 1023)
    Workspace(str(open_folder), disk_mb=8).close()
    _empty_files(open_folder, 1100)
    with pytest.raises(UsageError) as e: Workspace(str(open_folder), disk_mb=8)
    assert str(e.value) == (f'sandbox workdir {open_folder} holds 1100 files and folders, more than the 1023 a '
                            'workspace of --disk 8 holds (64 per MiB, at least 1024)')
    monkeypatch.setattr(sbm, '_census', lambda top: (0, None))   # the control
    with pytest.raises(OSError) as e: Workspace(str(open_folder), disk_mb=8)
    assert e.value.errno == errno.ENOSPC and e.value.filename.startswith(f'{open_folder}/f')

# --- what the copy back cannot remove is said ----------------------------------------------------------------------

@needs_root
@pytest.mark.parametrize('immutable', [True, False], ids=['immutable', 'control'])
def test_what_the_copy_back_cannot_remove_is_named_in_a_warning(open_folder, caplog, immutable):
    """The named folder holds sub/f marked immutable (`chattr +i`): the run's files come back, and what the copy back
    moved aside but could not remove stays in its hidden folder, named in one warning line with that folder. The
    control: the same folder without the mark leaves no hidden folder and no warning."""
    from apex3.agent.workspace import STAGING
    folder = open_folder
    (folder / 'sub').mkdir()
    (folder / 'sub' / 'f').write_text('frozen')
    if immutable and subprocess.run(['chattr', '+i', str(folder / 'sub' / 'f')], capture_output=True).returncode:
        pytest.skip('chattr +i is not supported here')
    try:
        ws = Workspace(str(folder), disk_mb=4)
        pathlib.Path(ws.path, 'new.txt').write_text('new')
        ws.close()
        hidden = [n for n in os.listdir(folder) if n.startswith(STAGING)]
        warned = [r.getMessage() for r in caplog.records if 'could not be removed' in r.getMessage()]
        assert _listing(folder) - {f'{n}/sub' for n in hidden} - {f'{n}/sub/f' for n in hidden} - set(hidden) == \
            {'sub', 'sub/f', 'new.txt'} and (folder / 'sub' / 'f').read_text() == 'frozen'
        if not immutable: assert (hidden, warned) == ([], [])
        else: assert len(hidden) == 1 and warned == [
            "sandbox workdir: 2 entries of what the run replaced could not be removed (the first: 'sub/f', maybe "
            f"immutable or append-only); they are left in {folder}/{hidden[0]}, root's"]
    finally:
        for t, _, fs in os.walk(folder):
            for n in fs: subprocess.run(['chattr', '-i', os.path.join(t, n)], capture_output=True)


def _workspace_process(then):
    "A Python that makes a 1 MiB workspace, prints its folder, then runs `then`: (process, folder)."
    code = f'from apex3.agent.workspace import Workspace; w = Workspace(disk_mb=1); print(w.path, flush=True); {then}'
    p = subprocess.Popen([sys.executable, '-c', code], stdout=subprocess.PIPE, text=True)
    return p, p.stdout.readline().strip()

@needs_root
def test_a_workspace_its_killed_process_left_mounted_is_swept():
    """A process killed after making its workspace runs no finalizer: its tmpfs stays mounted (the control), holding
    memory. The next workspace made removes it, and leaves alone the workspace of a process still running."""
    killed, k_folder = _workspace_process('import os, signal; os.kill(os.getpid(), signal.SIGKILL)')
    alive, a_folder = _workspace_process('import time; time.sleep(60)')
    try:
        killed.wait(30)
        assert _mounted(k_folder) and _mounted(a_folder)   # the control: nothing unmounted the killed one's
        Workspace(disk_mb=1).close()
        assert not _mounted(k_folder) and not os.path.exists(k_folder)
        assert _mounted(a_folder)
    finally:
        alive.kill(); alive.wait(30)
        Workspace(disk_mb=1).close()
    assert not _mounted(a_folder)
