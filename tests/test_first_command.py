"""The README's first command as CI runs it: the line `.ci/run` extracts, and the check of what it promises to leave
(tools/demo_files.py) against an empty folder, a complete one, and one whose loss did not fall."""
import json, subprocess, sys
from pathlib import Path

ROOT = Path(__file__).parents[1]
sys.path.insert(0, str(ROOT / 'tools'))
from demo_files import FILES, LINES, broken_promises, missing_files, missing_lines   # noqa: E402
from readme_commands import readme_command   # noqa: E402


def ci_extract(kind):
    "What `.ci/run` finds for `kind`: the command line of its `kind`_cmd assignment, run from the repository root."
    line = next(l for l in (ROOT / '.ci/run').read_text().splitlines() if l.startswith(f'{kind}_cmd=$('))
    cmd = line.split('$(', 1)[1].rsplit(')', 1)[0]
    return subprocess.run(['bash', '-c', cmd], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


def test_ci_runs_the_readme_first_command():
    cmd = ci_extract('first')
    assert cmd == readme_command('first') == 'pip install -e . torch==2.13.0 && apex3 demo'
    assert '[' not in cmd, 'no extras: the base install only'
    assert ci_extract('test').endswith('pytest -n 2'), 'the test command is still found apart from it'


def test_a_readme_without_the_command_is_one_line(tmp_path):
    (tmp_path / 'README.md').write_text('# apex3\n\n    pip install -e .\n')
    r = subprocess.run([sys.executable, '-c', f'import sys; sys.path.insert(0, {str(ROOT / "tools")!r}); '
                        f'from readme_commands import readme_command; readme_command("first", '
                        f'__import__("pathlib").Path({str(tmp_path / "README.md")!r}))'], capture_output=True, text=True)
    assert r.returncode == 1 and r.stderr.strip() == \
        'could not find the first command (pip install .*apex3 demo) in README.md'


def complete_demo(out: Path, loss_last=5.0):
    "A folder with every promised file (one byte or a few each) and a training result."
    for _, pattern, least in FILES:
        for i in range(least):
            p = out / pattern.replace('*', f'x{i}', 1).replace('*', 'y')
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text('x')
    res = dict(loss_first=9.0, loss_last=loss_last, val_code_first=9.0, val_code_last=5.5, sample='def f')
    (out / 'train' / 'demo.json').write_text(json.dumps(res))


def test_missing_files_names_each_one(tmp_path):
    assert len(missing_files(tmp_path)) == len(FILES)
    complete_demo(tmp_path)
    assert missing_files(tmp_path) == [] and broken_promises(tmp_path) == []
    (tmp_path / 'train' / 'loss.png').unlink()
    (tmp_path / 'agent' / 'traces' / 'tool-x0.jsonl').write_text('')   # empty counts as missing
    assert [m.split(':')[0] for m in missing_files(tmp_path)] == [
        'train/loss.png', 'the agent JSONL trace of a question answered through the tool']


def test_loss_that_did_not_fall_is_a_broken_promise(tmp_path):
    complete_demo(tmp_path, loss_last=9.5)
    assert broken_promises(tmp_path) == ['training loss did not fall: 9.000 -> 9.500']


def test_missing_lines(tmp_path):
    assert len(missing_lines('')) == len(LINES)
    assert missing_lines('\n'.join(frag for _, frag in LINES)) == []


def test_cli_exits_1_and_names_what_is_missing(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / 'tools/demo_files.py'), str(tmp_path)], capture_output=True,
                       text=True)
    assert r.returncode == 1 and r.stderr.count('missing: ') == len(FILES)
    complete_demo(tmp_path)
    r = subprocess.run([sys.executable, str(ROOT / 'tools/demo_files.py'), str(tmp_path)], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
