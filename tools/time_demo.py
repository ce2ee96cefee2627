"""Time the README's first command and record it: `python tools/time_demo.py --fresh` clones this repository's HEAD,
makes a fresh venv, runs the command's install part and then `apex3 demo` there (as a newcomer would, the venv's bin
first on PATH), checks every file and line the README promises (tools/demo_files.py), and appends one record to
`records/demo.jsonl`: wall and CPU seconds of the install, of the job and of each of its phases, the machine's core
count and its load average before and after, and the figures that show the job worked. Without `--fresh` it times
`apex3 demo` as found on PATH. The README's claim is about a quiet machine: the load average says how quiet it was."""
import argparse, json, os, resource, shutil, subprocess, sys, tempfile, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / 'tools'))
from demo_files import broken   # noqa: E402
from readme_commands import readme_command   # noqa: E402


def children_cpu() -> float:
    "CPU seconds of the child processes waited for so far (theirs and their own children's)."
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def timed(cmd, cwd, env, log) -> dict:
    "Run `cmd` in bash, its output appended to `log`: exit status, wall and CPU seconds."
    wall, cpu = time.perf_counter(), children_cpu()
    with open(log, 'a') as f:
        f.write(f'$ {cmd}\n')
        f.flush()
        rc = subprocess.run(['bash', '-c', cmd], cwd=cwd, env=env, stdout=f, stderr=subprocess.STDOUT).returncode
    return dict(rc=rc, wall_s=round(time.perf_counter() - wall, 1), cpu_s=round(children_cpu() - cpu, 1))


def fresh_checkout(work: Path):
    "A clone of HEAD and a fresh venv in `work`: (the clone, the environment whose PATH starts at the venv's bin)."
    clone, venv = work / 'apex3', work / 'venv'
    subprocess.run(['git', 'clone', '-q', str(ROOT), str(clone)], check=True)
    subprocess.run([sys.executable, '-m', 'venv', str(venv)], check=True)
    env = {k: v for k, v in os.environ.items() if k not in ('PYTHONPATH', 'VIRTUAL_ENV')}
    return clone, {**env, 'PATH': f"{venv / 'bin'}:{env['PATH']}", 'VIRTUAL_ENV': str(venv),
                   'PIP_DISABLE_PIP_VERSION_CHECK': '1', 'MPLBACKEND': 'Agg'}


def versions(env, names=('torch', 'triton', 'torchao', 'transformers')) -> dict:
    "The versions of `names` installed where the job ran (None: not installed): the record's own are this process's."
    code = '\n'.join(['import json, importlib.metadata as m', 'def v(n):',
                      ' try: return m.version(n)', ' except m.PackageNotFoundError: return None',
                      f'print(json.dumps({{n: v(n) for n in {list(names)!r}}}))'])
    r = subprocess.run(['python', '-c', code], env=env, capture_output=True, text=True)
    return json.loads(r.stdout) if r.returncode == 0 else {}


def figures(out: Path) -> dict:
    "The figures that show the job did what the README says: loss falling, the agent answering through the tool."
    figs = {}
    if (f := out / 'train' / 'demo.json').is_file():
        r = json.loads(f.read_text())
        figs.update({k: r[k] for k in r if k in ('steps', 'tokens') or k.endswith(('_first', '_last'))})
    if (f := out / 'agent' / 'agent_demo.json').is_file():
        r = json.loads(f.read_text())
        figs.update(agent_steps=r['steps'], agent_loss_first=r['loss_first'], agent_loss_last=r['loss_last'],
                    with_tool_accuracy=r['with_tool']['answer_accuracy'],
                    without_tool_accuracy=r['without_tool']['answer_accuracy'])
    return figs


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split(':')[0])
    p.add_argument('--fresh', action='store_true', help='a fresh clone and venv, the whole first command (install too)')
    p.add_argument('--work', help='folder for the clone, venv and log (default: a new temporary one, removed)')
    p.add_argument('--no-record', action='store_true', help='print the record; do not append it to records/')
    a = p.parse_args(argv)
    work = Path(a.work or tempfile.mkdtemp(prefix='apex3-time-demo-'))
    work.mkdir(parents=True, exist_ok=True)
    log, cmd = work / 'demo.log', readme_command('first')
    install_cmd, demo_cmd = (c.strip() for c in cmd.split('&&', 1))
    load_before = os.getloadavg()
    if a.fresh: cwd, env = fresh_checkout(work)
    else: cwd, env = work, dict(os.environ)
    install = timed(install_cmd, cwd, env, log) if a.fresh else None
    demo = timed(demo_cmd, cwd, env, log) if not install or install['rc'] == 0 else None
    out = Path(cwd) / 'apex3-demo'
    phases = json.loads(t.read_text()) if (t := out / 'timings.json').is_file() else {}
    missing = broken(out, log.read_text(errors='replace'))
    rec = dict(kind='demo', command=cmd if a.fresh else demo_cmd, fresh=a.fresh,
               ran_commit=subprocess.run(['git', 'rev-parse', 'HEAD'], cwd=cwd, capture_output=True,
                                         text=True).stdout.strip() or None,
               cpus=os.cpu_count(), cpus_usable=len(os.sched_getaffinity(0)),
               load_before=[round(x, 2) for x in load_before], load_after=[round(x, 2) for x in os.getloadavg()],
               ran_with=versions(env), install=install, demo=demo, phases=phases, missing=missing, **figures(out))
    rec['under_3_minutes'] = bool(demo and demo['rc'] == 0 and demo['wall_s'] < 180)
    if a.no_record: print(json.dumps(rec, indent=1))
    else:
        sys.path.insert(0, str(ROOT))
        from apex3.records import append_records
        print(f"appended to {append_records([rec], ROOT / 'records' / 'demo.jsonl')}:\n{json.dumps(rec, indent=1)}")
    ok = demo is not None and demo['rc'] == 0 and not missing
    if not ok: print(f'the first command failed or left something out; its log: {log}', file=sys.stderr)
    elif not a.work: shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == '__main__': sys.exit(main())
