"""Faults a data run meets, injected and judged from outside: SIGKILL of `apex3 data run` leaves no process behind
(read from /proc; the control runs the same pool with the protection off and finds survivors), SIGKILL of one pool
worker mid-task is one line naming its task, exit 2, and a rerun resumes to a clean run's bytes, outputs get the
umask's mode, a disk clearly too small for a run is refused before any work (one line, exit 2) and a tight one
warned about, a read-only output folder and a full disk are one line naming the path and the cause, exit 2, and the
last good state survives: a rerun with room finishes with outputs byte-identical to an undisturbed run's; a shard
cut short between runs is one line naming it, exit 2, not a silent short read."""
import glob, os, random, re, shutil, signal, subprocess, sys, tempfile, textwrap, time
from pathlib import Path
import pytest

ROOT = Path(__file__).parents[1]
CLI = 'import sys; from apex3.cli import main; sys.exit(main())'
ENV = {**os.environ, 'PYTHONPATH': f"{ROOT}{os.pathsep}{Path(__file__).parent}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
CONFIG = '''[pipeline]
out = "{out}"
workers = {workers}
[[source]]
name = "s"
kind = "jsonl"
path = "{raw}/*.jsonl"
shards = {shards}
stages = ["gopher_repetition", "redact", "dedup"]
[tokenize]
vocab_size = 512
[long]
min_tokens = 64
'''

def corpus(folder, n_files=4, docs=300, seed=0):
    "JSONL files of random-word documents (incompressible enough to fill a small file system)."
    rng, folder = random.Random(seed), Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    words = [''.join(rng.choice('abcdefghijklmnopqrstuvwxyz') for _ in range(rng.randrange(2, 9))) for _ in range(3000)]
    for f in range(n_files):
        lines = ['{"text": "%s."}' % ' '.join(rng.choice(words) for _ in range(rng.randrange(50, 400))) for _ in range(docs)]
        (folder/f'{f}.jsonl').write_text('\n'.join(lines) + '\n')
    return folder

def config(tmp, out, workers=1, shards=4) -> Path:
    p = Path(tmp)/'c.toml'
    p.write_text(CONFIG.format(out=out, raw=Path(tmp)/'raw', workers=workers, shards=shards))
    return p

def apex3(*args, **kw): return subprocess.run([sys.executable, '-c', CLI, *map(str, args)], env=ENV, capture_output=True,
                                              text=True, **kw)

def proc_table() -> dict:
    "{pid: (parent pid, start time, state)} of every process, read from /proc."
    out = {}
    for p in os.listdir('/proc'):
        if not p.isdigit(): continue
        try: s = Path(f'/proc/{p}/stat').read_text()
        except OSError: continue
        f = s[s.rindex(')') + 2:].split()
        out[int(p)] = (int(f[1]), int(f[19]), f[0])
    return out

def descendants(pid) -> dict:
    "{pid: start time} of every process below `pid`."
    t, out, todo = proc_table(), {}, [pid]
    while todo:
        x = todo.pop()
        for c, (pp, start, _) in t.items():
            if pp == x and c not in out:
                out[c] = start
                todo.append(c)
    return out

def alive(procs) -> list:
    "The processes of `procs` still running (same pid and start time, not a zombie)."
    t = proc_table()
    return [p for p, start in procs.items() if p in t and t[p][1] == start and t[p][2] != 'Z']

def kill_and_survivors(cmd, cwd, n_children=3, grace=5.0) -> list:
    "Start `cmd`, wait for its pool (workers and resource tracker), SIGKILL it; the children alive `grace` s later."
    p = subprocess.Popen(cmd, cwd=cwd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t0 = time.time()
    while len(descendants(p.pid)) < n_children and p.poll() is None and time.time() - t0 < 60: time.sleep(0.05)
    kids = descendants(p.pid)
    assert len(kids) >= n_children and p.poll() is None, f'the run ended or never started its pool: {kids}'
    p.send_signal(signal.SIGKILL)
    p.wait()
    t0 = time.time()
    while alive(kids) and time.time() - t0 < grace: time.sleep(0.1)
    return alive(kids)

SLOW_POOL = textwrap.dedent('''
    import sys, time
    from apex3.data import core
    class Sleepy(core.Stage):
        name, out = 'sleepy', sys.argv[2]
        def n_tasks(self): return 4
        def run(self, i):
            time.sleep(60)
            return {}
    if __name__ == '__main__':
        core.LocalExecutor(3, progress=False, workers_die_with_parent=sys.argv[1] == 'on').run(Sleepy())
''')

def test_sigkill_leaves_no_process(tmp_path):
    corpus(tmp_path/'raw', n_files=4, docs=400)
    cmd = [sys.executable, '-c', CLI, 'data', 'run', config(tmp_path, 'out', workers=3)]  # two pool workers
    survivors = kill_and_survivors(cmd, tmp_path)
    assert survivors == []

def test_sigkill_control_without_the_protection(tmp_path):
    "The same pool with `workers_die_with_parent` on leaves nothing; off, its workers and tracker outlive the kill."
    (tmp_path/'slow_pool.py').write_text(SLOW_POOL)
    # on: up to 10 s for the workers to notice (they return as soon as none is left; a loaded machine is slow);
    # off: 2 s are enough to see them still there
    run = lambda flag, grace: kill_and_survivors([sys.executable, 'slow_pool.py', flag, str(tmp_path/'out')], tmp_path,
                                                 grace=grace)
    assert run('on', 10) == []
    left = run('off', 2)
    try: assert len(left) >= 2, left  # the control: the check can fail
    finally:
        for pid in left: os.kill(pid, signal.SIGKILL)  # processes this test started

def test_outputs_follow_the_umask(tmp_path):
    corpus(tmp_path/'raw', n_files=1, docs=20)
    for mask, mode in ((0o027, 0o640), (0o002, 0o664)):
        out = tmp_path/f'out{mask:o}'
        p = subprocess.run([sys.executable, '-c', f'import os; os.umask({mask}); ' + CLI, 'data', 'run',
                            config(tmp_path, out)], env=ENV, capture_output=True, text=True)
        assert p.returncode == 0, p.stderr[-2000:]
        modes = {oct(f.stat().st_mode & 0o777) for f in out.rglob('*') if f.is_file()}
        assert modes == {oct(mode)}, (mask, modes)

def _can_mount() -> str:
    "Why a private mount namespace is not available here, or '' when it is."
    if not shutil.which('unshare'): return 'no unshare'
    p = subprocess.run(['unshare', '-rm', 'sh', '-c', 'mount -t tmpfs -o size=1m tmpfs /mnt'], capture_output=True, text=True)
    return '' if p.returncode == 0 else f'unshare -rm + tmpfs refused: {p.stderr.strip()[:100]}'

IN_NAMESPACE = textwrap.dedent('''
    # runs as root of a private user and mount namespace: the tmpfs and its remounts are invisible outside
    import json, subprocess, sys
    from pathlib import Path
    tmp, CLI = Path(sys.argv[1]), 'import sys; from apex3.cli import main; sys.exit(main())'
    run = lambda cfg: subprocess.run([sys.executable, '-c', CLI, 'data', 'run', str(cfg)], capture_output=True, text=True)
    files = lambda d: {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob('*'))
                       if p.is_file() and '.done' not in p.parts and p.name != 'markers.json'}
    mnt, res = tmp/'mnt', {}
    mnt.mkdir()
    subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=64k', 'tmpfs', str(mnt)], check=True)
    tiny = run(tmp/'full.toml')                      # clearly too small: refused before any work
    res['tiny'] = dict(rc=tiny.returncode, err=tiny.stderr, files=[str(p) for p in mnt.rglob('*') if p.is_file()])
    subprocess.run(['mount', '-o', 'remount,size=256k', str(mnt)], check=True)
    full = run(tmp/'full.toml')                      # tight: a warning, then the disk fills mid-run
    res['full'] = dict(rc=full.returncode, err=full.stderr)
    res['markers_at_full'] = sorted(str(p.relative_to(mnt)) for p in mnt.rglob('.done/*.json'))
    subprocess.run(['mount', '-o', 'remount,size=64m', str(mnt)], check=True)
    again = run(tmp/'full.toml')                     # room again: resumes from what finished
    res['resumed'] = dict(rc=again.returncode, err=again.stderr[-500:])
    res['same_as_clean'] = files(mnt/'out') == files(tmp/'clean')
    before = files(mnt/'out')
    subprocess.run(['mount', '-o', 'remount,ro', str(mnt)], check=True)
    ro = run(tmp/'full.toml')                        # the folder turned read-only
    res['ro'] = dict(rc=ro.returncode, err=ro.stderr, intact=files(mnt/'out') == before)
    print(json.dumps(res))
''')

def test_full_disk_and_read_only_folder(tmp_path):
    why = _can_mount()
    if why: pytest.skip(why)
    corpus(tmp_path/'raw', n_files=4, docs=150)
    clean = apex3('data', 'run', config(tmp_path, tmp_path/'clean'))
    assert clean.returncode == 0, clean.stderr[-2000:]
    (tmp_path/'full.toml').write_text(config(tmp_path, tmp_path/'mnt'/'out').read_text())
    (tmp_path/'ns.py').write_text(IN_NAMESPACE)
    p = subprocess.run(['unshare', '-rm', sys.executable, str(tmp_path/'ns.py'), str(tmp_path)], env=ENV,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    import json
    res = json.loads(p.stdout.splitlines()[-1])
    print(res)
    tiny, full, ro = res['tiny'], res['full'], res['ro']
    assert tiny['rc'] == 2 and tiny['err'].count('\n') == 1 and tiny['files'] == [], tiny
    assert re.fullmatch(rf'apex3 data: error: {re.escape(str(tmp_path/"mnt"/"out"))}: 64.0 KiB free, but the ingest '
                        r'copies of the inputs alone take about \S+ \S+ \(about \S+ \S+ if every document is kept\): '
                        r'free some space or set pipeline.out elsewhere\n', tiny['err']), tiny['err']
    warning, error = full['err'].splitlines()      # the check let the tight disk start, with a warning
    assert full['rc'] == 2 and 'Traceback' not in full['err'], full['err'][-2000:]
    assert warning.startswith(f'apex3 data: warning: {tmp_path/"mnt"/"out"}: ') and 'may run out of space' in warning
    assert 'No space left on device' in error and str(tmp_path/'mnt'/'out') in error
    assert res['resumed']['rc'] == 0, res['resumed']
    assert res['same_as_clean']  # nothing half-written survived the full disk
    assert ro['rc'] == 2 and ro['err'].count('\n') == 1 and 'Read-only file system' in ro['err'], ro['err']
    assert str(tmp_path/'mnt'/'out') in ro['err'] and ro['intact']

def pool_workers(pid) -> list:
    "The pool workers below `pid` (spawned children that are not multiprocessing's resource tracker)."
    out = []
    for c in descendants(pid):
        try: cmd = Path(f'/proc/{c}/cmdline').read_bytes()
        except OSError: continue
        if b'spawn_main' in cmd and b'resource_tracker' not in cmd: out.append(c)
    return out

def cpu_ticks(pid) -> int:
    try: s = Path(f'/proc/{pid}/stat').read_text()
    except OSError: return -1
    f = s[s.rindex(')') + 2:].split()
    return int(f[11]) + int(f[12])

def busy_worker(pid, stage_glob, timeout=60) -> int:
    "Once a task of the stage has finished (so the workers are past their start-up), a worker using CPU now."
    t0 = time.time()
    while time.time() - t0 < timeout:
        ws = pool_workers(pid)
        if len(ws) == 2 and glob.glob(stage_glob):
            before = {w: cpu_ticks(w) for w in ws}
            time.sleep(0.1)
            busy = [w for w in ws if cpu_ticks(w) > before[w] >= 0]
            if busy: return busy[0]
        time.sleep(0.02)
    raise AssertionError('no busy pool worker seen')

def test_worker_killed_mid_task_is_one_line_and_resumes(tmp_path):
    "SIGKILL of one pool worker from outside: exit 2, one line naming the task; a rerun resumes to a clean run's bytes."
    from apex3.data.pipeline import output_files
    # twelve tasks of a few tenths of a second for three processes: a worker found busy once the first has ended has
    # more to do after its task, so it is between two only for the moment a task is handed over
    corpus(tmp_path/'raw', n_files=8, docs=1500)
    clean = apex3('data', 'run', config(tmp_path, tmp_path/'clean', workers=3, shards=12))
    assert clean.returncode == 0, clean.stderr[-2000:]
    cfg = config(tmp_path, tmp_path/'out', workers=3, shards=12)   # this process and two pool workers
    p = subprocess.Popen([sys.executable, '-c', CLI, 'data', 'run', cfg], env=ENV, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    victim = busy_worker(p.pid, str(tmp_path/'out/work/s/01_*/.done/*.json'))
    kids = descendants(p.pid)
    os.kill(victim, signal.SIGKILL)
    err = p.communicate(timeout=120)[1]
    assert p.returncode == 2 and err.count('\n') == 1 and 'Traceback' not in err, err[-2000:]
    assert re.fullmatch(rf'apex3 data: error: a pool worker \(pid {victim}\) was killed by SIGKILL while running task '
                        r'shard-\d{5} of stage s:gopher_repetition\+redact; '
                        r'finished tasks are kept: run again to resume\n',
                        err), err
    t0 = time.time()
    while alive(kids) and time.time() - t0 < 5: time.sleep(0.1)  # the resource tracker ends just after the run
    assert alive(kids) == []  # the other workers and the tracker ended with the run
    done_before = len(list((tmp_path/'out/work/s').glob('01_*/.done/*.json')))
    assert 1 <= done_before < 12
    again = apex3('data', 'run', cfg)
    assert again.returncode == 0, again.stderr[-2000:]
    a, b = output_files(tmp_path/'clean'), output_files(tmp_path/'out')
    assert sorted(a) == sorted(b) and all(a[k] == b[k] for k in a)  # no stale temporary file, nothing half-written

def test_a_damaged_shard_is_one_line_and_its_stage_remade(tmp_path):
    """A stage's shard garbled between runs (a disk fault), its size as written, so its marker still vouches for it:
    the run that reads it exits 2 with one line naming the file, where a short read would have lost its documents
    silently; the control, the same run with the shard whole, finishes. Doing what the line says (remove the folder
    of the stage that wrote it) and running again gives a clean run's bytes. (A shard cut short is another size:
    its task is redone, `test_data_cli`.)"""
    from apex3.data.pipeline import output_files
    corpus(tmp_path/'raw', n_files=2, docs=200)
    clean = apex3('data', 'run', config(tmp_path, tmp_path/'clean', workers=2))
    assert clean.returncode == 0, clean.stderr[-2000:]
    out, cfg = tmp_path/'out', config(tmp_path, tmp_path/'out', workers=2)
    def stopped_after_stage_1():   # as a run stopped once stage 1 was done: what comes after it is gone
        assert apex3('data', 'run', cfg).returncode == 0
        for p in out.iterdir():
            if p.name != 'work': shutil.rmtree(p) if p.is_dir() else p.unlink()
        for p in (out/'work/s').glob('02_*'): shutil.rmtree(p)
        return next((out/'work/s').glob('01_*'))
    stage = stopped_after_stage_1()
    control = apex3('data', 'run', cfg)
    assert control.returncode == 0, control.stderr[-2000:]
    shutil.rmtree(out)
    stage = stopped_after_stage_1()
    shard = sorted(stage.glob('*.jsonl.zst'))[1]
    shard.write_bytes(shard.read_bytes()[:-100] + bytes(100))
    r = apex3('data', 'run', cfg)
    assert r.returncode == 2 and r.stderr.count('\n') == 1 and 'Traceback' not in r.stderr, r.stderr[-2000:]
    assert r.stderr.startswith(f'apex3 data: error: {shard}: damaged zstandard data'), r.stderr
    assert 'remove the folder of the stage that wrote it' in r.stderr
    shutil.rmtree(stage)
    again = apex3('data', 'run', cfg)
    assert again.returncode == 0, again.stderr[-2000:]
    a, b = output_files(tmp_path/'clean'), output_files(out)
    assert sorted(a) == sorted(b) and all(a[k] == b[k] for k in a)

DEMO_ON_TMPFS = textwrap.dedent('''
    # as root of a private mount namespace: `apex3 data demo` onto a 64 KiB tmpfs, which the corpus copy fills
    import json, subprocess, sys
    from pathlib import Path
    mnt = Path(sys.argv[1])/'mnt'
    mnt.mkdir()
    subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=64k', 'tmpfs', str(mnt)], check=True)
    p = subprocess.run([sys.executable, '-c', 'import sys; from apex3.cli import main; sys.exit(main())',
                        'data', 'demo', str(mnt/'out')], capture_output=True, text=True)
    print(json.dumps(dict(rc=p.returncode, err=p.stderr)))
''')

def test_demo_on_a_full_disk_names_the_output_path(tmp_path):
    "The corpus copy fills the disk: the line names the file being written under OUT, not the library file read."
    why = _can_mount()
    if why:
        print(f'skipped: {why}')
        pytest.skip(why)
    (tmp_path/'ns.py').write_text(DEMO_ON_TMPFS)
    p = subprocess.run(['unshare', '-rm', sys.executable, str(tmp_path/'ns.py'), str(tmp_path)], env=ENV,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    import json
    res = json.loads(p.stdout.splitlines()[-1])
    err, out = res['err'], str(tmp_path/'mnt'/'out')
    assert res['rc'] == 2 and err.count('\n') == 1 and 'Traceback' not in err, err[-2000:]
    assert re.fullmatch(rf'apex3 data: error: {re.escape(out)}/\S+: No space left on device \(ENOSPC\); .*\n', err), err
    assert sys.prefix not in err and sys.base_prefix not in err, err   # no library file is named

def test_a_copy_error_names_its_target_only_for_a_storage_failure(tmp_path):
    """`shutil.copyfile` reports (source, target) for any failure: a full target names the target; the control, a
    missing source, still names the source first, and the plain `os_error_line` (no protection) leads with the
    source."""
    import errno
    from apex3.data.pipeline import fs_error_line
    from apex3.usage import os_error_line
    full = OSError(errno.ENOSPC, 'No space left on device', '/lib/python/x.py', None, str(tmp_path/'out'/'x.py'))
    assert fs_error_line(full).startswith(f"{tmp_path/'out'/'x.py'}: No space left on device (ENOSPC); ")
    assert os_error_line(full).startswith('/lib/python/x.py -> ')
    try: shutil.copyfile(tmp_path/'missing.py', tmp_path/'copy.py')
    except OSError as e: missing = e
    assert fs_error_line(missing).startswith(f"{tmp_path/'missing.py'}: No such file or directory (ENOENT)")
