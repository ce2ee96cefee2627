"The flags derived from the run settings are the flags `apex3 bench` and `apex3 train` had: names, defaults, choices."
import json, re
from pathlib import Path
import pytest, torch
from apex3.bench import bench_parser
from apex3.train import train_parser

MAIN = json.loads((Path(__file__).parent / 'run_flags_main.json').read_text())
PARSERS = {'bench': bench_parser, 'train': train_parser}

def help_flags(text) -> set:
    "The long flags an argparse help text lists in its option rows (not those its help sentences mention)."
    rows = [l for l in text.splitlines() if re.match(r'^  -', l)]
    return {f for l in rows for f in re.findall(r'--[\w-]+', re.split(r'\s{2,}', l.strip())[0])}

def test_help_flags_sees_rows_only():
    text = 'options:\n  -h, --help            show\n  --steps STEPS         timed steps (see --warmup)\n'
    assert help_flags(text) == {'--help', '--steps'}

@pytest.mark.parametrize('name', ['bench', 'train'])
def test_help_lists_the_flags_of_main(name):
    assert help_flags(PARSERS[name]().format_help()) == set(MAIN[name])

@pytest.mark.parametrize('name', ['bench', 'train'])
def test_flags_keep_defaults_and_choices(name):
    now = {o: act for act in PARSERS[name]()._actions for o in act.option_strings if o.startswith('--')}
    for flag, was in MAIN[name].items():
        act = now[flag]
        default = ('cuda' if torch.cuda.is_available() else 'cpu') if flag == '--device' else was['default']
        got = dict(default=act.default, choices=list(act.choices) if act.choices else None, nargs=act.nargs,
                   type=getattr(act.type, '__name__', None), action=type(act).__name__)
        assert got == dict(was, default=default), flag
