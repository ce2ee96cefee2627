"""Print the index's chapter table: every chapter in `nbs/`, linked, with the module it exports and the summary line of
its title cell. usage: python tools/chapter_table.py   (paste the output into nbs/index.ipynb, then run tools/readme.py)"""
import json, re
from pathlib import Path

def chapter_row(path: Path) -> str:
    cells = json.loads(path.read_text())['cells']
    srcs = [''.join(c['source']) for c in cells]
    mod = next((m.group(1) for s in srcs if (m := re.search(r'#\|\s*default_exp\s+(\S+)', s))), None)
    title = next(s for c, s in zip(cells, srcs) if c['cell_type'] == 'markdown')
    quote = ' '.join(l[1:].strip() for l in title.splitlines() if l.startswith('>'))
    summary = quote or re.search(r'^#\s+(.+)$', title, re.M).group(1)
    module = f"`apex3/{mod.replace('.', '/')}.py`" if mod else ''
    return f"| [{path.stem}]({path.name}) | {module} | {summary.replace('|', '/')} |"

def chapter_table(nbs=Path('nbs')) -> str:
    paths = [p for p in sorted(nbs.glob('*.ipynb')) if not p.name.startswith('_') and p.name != 'index.ipynb']
    return '\n'.join(['| chapter | module | what it covers |', '|---|---|---|', *map(chapter_row, paths)])

if __name__ == '__main__': print(chapter_table())
