"Agent Skills: the specification's front-matter rules, the shipped example skill, and its script run in the sandbox."
import csv, io, json, shutil, statistics
from pathlib import Path
import pytest
from apex3.agent.skills import Skill, SkillError, example_skills_dir, load_skill, load_skills, skill_catalog

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
