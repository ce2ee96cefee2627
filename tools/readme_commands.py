"""The README's two set-up commands, found by what they run: `first` installs apex3 and runs `apex3 demo`, `test`
installs everything and runs pytest. `.ci/run` runs them verbatim and tools/time_demo.py times the first; both find
them here.   usage: python3 tools/readme_commands.py first|test"""
import re, sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / 'README.md'
PATTERNS = {'first': r'pip install .*apex3 demo', 'test': r'pip install .*pytest'}

def readme_command(kind, readme=README) -> str:
    "The first line of `readme` (leading spaces dropped) that matches `kind`'s pattern."
    for line in readme.read_text().splitlines():
        if re.match(PATTERNS[kind], line.strip()): return line.strip()
    raise SystemExit(f'could not find the {kind} command ({PATTERNS[kind]}) in {readme.name}')

if __name__ == '__main__':
    if len(sys.argv) != 2 or sys.argv[1] not in PATTERNS: raise SystemExit(__doc__.split('usage: ')[1])
    print(readme_command(sys.argv[1]))
