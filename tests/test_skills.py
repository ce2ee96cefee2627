"Agent Skills: the specification's front-matter rules, the shipped example skill, and its script run in the sandbox."
import csv, io, json, os, shutil, stat, statistics, time
from pathlib import Path
import pytest
from hypothesis import given, settings, strategies as st
from apex3.agent.sandbox import get_sandbox
from apex3.agent.skills import (Skill, SkillError, example_skills_dir, load_skill, load_skills, place_scripts,
                                 skill_catalog)

def write_skill(root, folder, front, body='Do the thing.\n'):
    (root / folder).mkdir(parents=True)
    (root / folder / 'SKILL.md').write_text(f'---\n{front}\n---\n{body}')
    return root / folder

@pytest.mark.parametrize('front, message', [
    ('name: Upper\ndescription: d', 'must be 1-64 characters'),
    ('name: a--b\ndescription: d', 'must be 1-64 characters'),
    ('name: -s\ndescription: d', 'must be 1-64 characters'),
    ('name: ' + 'a' * 65 + '\ndescription: d', 'must be 1-64 characters'),
    ('name: other-name\ndescription: d', "must equal the folder name"),
    ('name: s\ndescription: ""', 'description must be 1-1024'),
    ('name: s\ndescription: ' + 'x' * 1025, 'description must be 1-1024'),
    ('name: s\ndescription: d\ncompatibility: ' + 'x' * 501, 'compatibility must be 1-500'),
    ('name: s\ndescription: d\nmetadata:\n  version: 1.0', 'metadata must map strings to strings'),
    ('name: s\ndescription: d\nallowed-tools: [a, b]', 'allowed-tools must be a space-separated string'),
    ('name: s\ndescription: d\nauthor: me', "unknown field 'author'"),
    ('- just\n- a list', 'front matter must be a YAML mapping'),
])
def test_front_matter_rules(tmp_path, front, message):
    folder = write_skill(tmp_path, 's', front)  # a bad name is reported before it is compared with the folder's
    with pytest.raises(SkillError, match=message): load_skill(folder)

def test_valid_skill_round_trip(tmp_path):
    front = 'name: s-1\ndescription: "Use for: tests"\nlicense: MIT\nmetadata:\n  k: v\nallowed-tools: sandbox python'
    s = load_skill(write_skill(tmp_path, 's-1', front, body='\n# Steps\n1. go\n'))
    assert (s.name, s.description, s.license) == ('s-1', 'Use for: tests', 'MIT')
    assert (s.metadata, s.allowed_tools) == ({'k': 'v'}, ['sandbox', 'python'])
    assert s.body() == '# Steps\n1. go'

def test_bad_skills_are_skipped_not_fatal(tmp_path, caplog):
    shutil.copytree(example_skills_dir() / 'csv-summary', tmp_path / 'csv-summary')
    write_skill(tmp_path, 'broken', 'name: [x')
    (tmp_path / 'no-front').mkdir()
    (tmp_path / 'no-front' / 'SKILL.md').write_text('# no front matter\n')
    assert [s.name for s in load_skills([tmp_path])] == ['csv-summary']
    assert sum('skipping skill' in r.message for r in caplog.records) == 2
    with pytest.raises(SkillError): load_skills([tmp_path], strict=True)

def test_an_alias_bomb_in_the_front_matter_is_skipped_quickly(tmp_path, caplog):
    "A 350-byte SKILL.md whose name is YAML aliases of 10^8 leaves: skipped with its one warning, in well under 1 s."
    lines, prev = ['a: &a ["x","x","x","x","x","x","x","x","x","x"]'], 'a'
    for c in 'bcdefgh':
        lines.append(f'{c}: &{c} [' + ','.join([f'*{prev}'] * 10) + ']')
        prev = c
    write_skill(tmp_path, 'bomb', '\n'.join(lines + [f'name: *{prev}', 'description: d']))
    t0 = time.perf_counter()
    assert load_skills([tmp_path]) == [] and time.perf_counter() - t0 < 1
    assert any('name of type list must be' in r.message for r in caplog.records)

DEEP_FRONT = 'name: deep\ndescription: ' + '[' * 20_000 + ']' * 20_000

def test_deep_or_unreadable_skills_are_skipped_and_the_good_one_loaded(tmp_path, caplog, monkeypatch):
    """A front matter nested 20,000 deep and a SKILL.md that cannot be read: each skipped with its warning, the good
    skill beside them loaded; `strict` raises a SkillError. Controls: the YAML parser itself fails on that front
    matter, and the unreadable file really is refused to a read."""
    import yaml
    shutil.copytree(example_skills_dir() / 'csv-summary', tmp_path / 'csv-summary')
    write_skill(tmp_path, 'deep', DEEP_FRONT)
    locked = write_skill(tmp_path, 'locked', 'name: locked\ndescription: d') / 'SKILL.md'
    locked.chmod(0)
    if os.geteuid() == 0:   # root reads any mode: the kernel's refusal as a non-root user meets it
        real = Path.read_text
        def refuse(self, *a, **k):
            if self == locked: raise PermissionError(13, 'Permission denied', str(self))
            return real(self, *a, **k)
        monkeypatch.setattr(Path, 'read_text', refuse)
    with pytest.raises(PermissionError): locked.read_text()
    with pytest.raises(RecursionError): yaml.safe_load(DEEP_FRONT)
    assert [s.name for s in load_skills([tmp_path])] == ['csv-summary']
    warned = [r.message for r in caplog.records if 'skipping skill' in r.message]
    assert len(warned) == 2 and 'nested too deep' in warned[0] and 'cannot be read: Permission denied' in warned[1]
    for bad in ('deep', 'locked'):
        with pytest.raises(SkillError): load_skills([tmp_path / bad], strict=True)

def test_catalog_lists_name_description_and_location():
    skills = load_skills([example_skills_dir()], strict=True)
    cat = skill_catalog(skills)
    for s in skills:
        assert f'<name>{s.name}</name>' in cat and str(s.path / 'SKILL.md') in cat
    assert skill_catalog([Skill('x', 'a </skill> b', Path('/x'))]).count('</skill>') == 1

def test_references_cannot_escape(tmp_path):
    s = load_skills([example_skills_dir()], strict=True)[0]
    assert s.reference('FORMAT.md').startswith('# Output of summarize')
    (tmp_path / 'outside.md').write_text('secret')
    for name in ['../SKILL.md', '../../csv-summary/SKILL.md', str(tmp_path / 'outside.md')]:
        with pytest.raises(SkillError): s.reference(name)

@pytest.mark.skipif(shutil.which('bwrap') is None, reason='bubblewrap is not installed')
def test_example_script_runs_in_the_sandbox_and_agrees_with_statistics():
    s = load_skills([example_skills_dir()], strict=True)[0]
    table = 'x,y,label\n1,10,a\n2,,b\n4,-3.5,c\n8,7,d\n'
    r = s.run_script('summarize', ['-'], stdin=table)
    assert r.exit_code == 0, r.stderr
    got = json.loads(r.stdout)
    rows = list(csv.DictReader(io.StringIO(table)))
    for col in ['x', 'y']:
        vals = [float(row[col]) for row in rows if row[col]]
        want = dict(count=len(vals), mean=statistics.fmean(vals), min=min(vals), max=max(vals),
                    stdev=statistics.stdev(vals))
        assert got['columns'][col] == pytest.approx(want)
    assert got['skipped'] == ['label']

# A command in the sandbox controls its workspace, which persists between commands: whatever link it leaves on the
# way to .skills/NAME/scripts must not make the host's copy of a skill's scripts write or chmod anything outside.
needs_bwrap = pytest.mark.skipif(shutil.which('bwrap') is None,
                                 reason='bubblewrap is not installed: no sandboxed command can plant a link')
SK = '.skills/csv-summary'
PLANTS = {  # where the command plants, and the shell line that does it ($1: the host folder outside the workspace)
    '.skills': 'ln -s "$1" .skills',
    '.skills/NAME': f'mkdir -p .skills && ln -s "$1" {SK}',
    'scripts': f'mkdir -p {SK} && ln -s "$1" {SK}/scripts',
    'scripts/summarize': f'mkdir -p {SK}/scripts && ln -s "$1/private.txt" {SK}/scripts/summarize',
    'scripts/summarize (dangling)': f'mkdir -p {SK}/scripts && ln -s "$1/new-file" {SK}/scripts/summarize',
}

def fingerprint(folder):
    "Every entry under `folder` (itself included) as path -> (mode, size, content), links not followed."
    out = {}
    for top, dirs, files in os.walk(folder):
        for p in [top] + [os.path.join(top, n) for n in files + dirs]:
            st = os.lstat(p)
            out[os.path.relpath(p, folder)] = (st.st_mode, st.st_size,
                                               Path(p).read_bytes() if stat.S_ISREG(st.st_mode) else None)
    return out

@pytest.fixture
def victim(tmp_path):
    "A host folder outside the workspace, mode 700, holding a private file of mode 600."
    d = tmp_path / 'victim'
    d.mkdir(mode=0o700)
    (d / 'private.txt').write_text('the host keeps this\n')
    os.chmod(d / 'private.txt', 0o600)
    return d

def unprotected_copy(skill, workdir):
    "CONTROL: the copy with the protection off (a plain copytree into the workspace, a chmod over what it finds)."
    shutil.copytree(skill.path / 'scripts', Path(workdir) / SK / 'scripts', dirs_exist_ok=True)
    for p in [Path(workdir) / '.skills', *(Path(workdir) / '.skills').rglob('*')]: os.chmod(p, 0o755)

def planted_sandbox(where, victim):
    sb = get_sandbox()
    r = sb.run(['sh', '-c', PLANTS[where], 'sh', str(victim)])
    assert r.exit_code == 0, r.stderr
    return sb

TABLE = 'x,y\n1,2\n3,5\n'

@needs_bwrap
@pytest.mark.parametrize('where', list(PLANTS))
def test_planted_link_cannot_make_run_script_write_outside(victim, where):
    s = load_skills([example_skills_dir()], strict=True)[0]
    before = fingerprint(victim)
    with planted_sandbox(where, victim) as sb:
        r = s.run_script('summarize', ['-'], sandbox=sb, stdin=TABLE)
        assert fingerprint(victim) == before  # no new file, no mode or content changed outside the workspace
        assert r.exit_code == 0, r.stderr  # the planted link was removed and the script copied fresh
        assert json.loads(r.stdout)['columns']['y']['mean'] == statistics.fmean([2, 5])
        assert not os.path.islink(os.path.join(sb.workdir, '.skills'))
    with planted_sandbox(where, victim) as sb:  # CONTROL: the same plant against the unprotected copy
        try: unprotected_copy(s, sb.workdir)
        except OSError: pass  # it may fail part-way, after writing outside
    assert fingerprint(victim) != before, f'the unprotected copy did not write outside through {where}'

@needs_bwrap
def test_a_file_where_a_folder_belongs_is_replaced():
    s = load_skills([example_skills_dir()], strict=True)[0]
    with get_sandbox() as sb:
        assert sb.run(['sh', '-c', 'echo x > .skills']).exit_code == 0
        assert s.run_script('summarize', ['-'], sandbox=sb, stdin=TABLE).exit_code == 0

@needs_bwrap
@pytest.mark.parametrize('protect', [True, False])
def test_no_write_through_a_hard_link_at_a_script(protect):
    "A hard link at scripts/summarize to the command's own file: the protected copy leaves that file as it was."
    s = load_skills([example_skills_dir()], strict=True)[0]
    with get_sandbox() as sb:
        line = f'echo mine > notes.txt && mkdir -p {SK}/scripts && ln notes.txt {SK}/scripts/summarize'
        assert sb.run(['sh', '-c', line]).exit_code == 0
        if protect: assert s.run_script('summarize', ['-'], sandbox=sb, stdin=TABLE).exit_code == 0
        else: unprotected_copy(s, sb.workdir)
        notes = (Path(sb.workdir) / 'notes.txt').read_text()
    assert (notes == 'mine\n') == protect  # CONTROL (protect=False): the plain copy writes the script into it

@needs_bwrap
@pytest.mark.parametrize('how, timeout', [('exit', None), ('timeout', 0.3)])
def test_no_command_outlives_its_run(how, timeout):
    "The copy runs between commands: a background process a command leaves behind must be gone when run returns."
    late = '(sleep 0.8; ln -s /x late-link) & '  # due after the command ends (it exits, or is killed at 0.3 s)
    with get_sandbox() as sb:
        r = sb.run(['sh', '-c', late + ('exit 0' if how == 'exit' else 'sleep 60')], timeout=timeout)
        assert r.timed_out == (how == 'timeout')
        time.sleep(1.2)
        assert not os.path.lexists(os.path.join(sb.workdir, 'late-link'))
        assert sb.run(['sh', '-c', late + 'wait']).exit_code == 0  # CONTROL: waited for, the same process plants
        assert os.path.islink(os.path.join(sb.workdir, 'late-link'))

def test_skill_links_out_of_scripts_are_not_copied(tmp_path, caplog):
    "A link in the skill's own scripts/ to a host file is skipped (a plain copytree would hand the file over)."
    shutil.copytree(example_skills_dir() / 'csv-summary', tmp_path / 'csv-summary')
    (tmp_path / 'secret.txt').write_text('host secret\n')
    (tmp_path / 'csv-summary/scripts/leak').symlink_to(tmp_path / 'secret.txt')
    (tmp_path / 'csv-summary/scripts/alias').symlink_to('summarize')
    (tmp_path / 'csv-summary/scripts/sub').mkdir()
    (tmp_path / 'csv-summary/scripts/sub/helper.py').write_text('print(1)\n')
    s = load_skill(tmp_path / 'csv-summary')
    ws = tmp_path / 'ws'
    ws.mkdir()
    place_scripts(s, ws)
    placed = ws / SK / 'scripts'
    got = {str(p.relative_to(placed)) for p in placed.rglob('*')}
    assert got == {'alias', 'summarize', 'sub', 'sub/helper.py'}
    assert not any(p.is_symlink() for p in placed.rglob('*'))
    assert all(stat.S_IMODE(p.lstat().st_mode) == 0o755 for p in placed.rglob('*'))
    assert (placed / 'alias').read_bytes() == (s.path / 'scripts/summarize').read_bytes()
    assert sum('leak is not copied' in r.message for r in caplog.records) == 1
    shutil.copytree(s.path / 'scripts', tmp_path / 'control')  # CONTROL: the plain copy follows the link out
    assert (tmp_path / 'control/leak').read_text() == 'host secret\n'

def test_scripts_folder_that_is_a_link_is_refused(tmp_path):
    skip = shutil.ignore_patterns('scripts')
    shutil.copytree(example_skills_dir() / 'csv-summary', tmp_path / 'csv-summary', ignore=skip)
    (tmp_path / 'csv-summary/scripts').symlink_to(example_skills_dir() / 'csv-summary/scripts')
    s = load_skill(tmp_path / 'csv-summary')
    with pytest.raises(SkillError, match='scripts/ is not a folder'): place_scripts(s, tmp_path)

def test_placing_again_replaces_what_the_command_left(tmp_path):
    "Files a command added or changed under scripts/ are gone after the next copy."
    s = load_skills([example_skills_dir()], strict=True)[0]
    place_scripts(s, tmp_path)
    placed = tmp_path / SK / 'scripts'
    (placed / 'extra').write_text('left behind')
    (placed / 'summarize').unlink()
    (placed / 'summarize').write_text('tampered')
    place_scripts(s, tmp_path)
    assert sorted(os.listdir(placed)) == ['summarize']
    assert (placed / 'summarize').read_bytes() == (s.path / 'scripts/summarize').read_bytes()

KINDS = ['absent', 'folder', 'file', 'link to folder', 'link to file', 'dangling link', 'hard link']

def plant_host_side(ws, victim, kinds):
    "Put one thing of each kind along .skills/NAME/scripts/summarize (deeper levels only under a real folder)."
    (ws / 'notes.txt').write_text('mine\n')
    path = ws
    for part, kind in zip(['.skills', 'csv-summary', 'scripts', 'summarize'], kinds):
        path = path / part
        if kind == 'folder': path.mkdir()
        elif kind == 'file': path.write_text('planted\n')
        elif kind == 'link to folder': path.symlink_to(victim)
        elif kind == 'link to file': path.symlink_to(victim / 'private.txt')
        elif kind == 'dangling link': path.symlink_to(victim / 'missing')
        elif kind == 'hard link': os.link(ws / 'notes.txt', path)
        if kind != 'folder': return

@given(kinds=st.lists(st.sampled_from(KINDS), min_size=4, max_size=4))
@settings(max_examples=60, deadline=None)
def test_any_planted_workspace_leaves_the_host_untouched(tmp_path_factory, kinds):
    "Whatever stands along the path, the copy writes only inside the workspace and leaves exactly the skill's scripts."
    s = load_skills([example_skills_dir()], strict=True)[0]
    root = tmp_path_factory.mktemp('case')
    victim, ws = root / 'victim', root / 'ws'
    victim.mkdir(mode=0o700)
    (victim / 'private.txt').write_text('the host keeps this\n')
    os.chmod(victim / 'private.txt', 0o600)
    ws.mkdir()
    plant_host_side(ws, victim, kinds)
    before = fingerprint(victim)
    place_scripts(s, ws)
    assert fingerprint(victim) == before
    assert (ws / 'notes.txt').read_text() == 'mine\n'
    placed = ws / SK / 'scripts'
    assert not any(p.is_symlink() for p in [ws / '.skills', ws / SK, placed])
    assert sorted(os.listdir(placed)) == ['summarize']
    assert (placed / 'summarize').read_bytes() == (s.path / 'scripts/summarize').read_bytes()
