"""README.md is generated from nbs/index.ipynb (nbdev's `readme_nb`): its markdown cells, and its code cells as Python
blocks followed by their stored text output; links to chapters (`00_plan.ipynb`, as they work beside the index in
JupyterLab, on GitHub and on the site) become `nbs/00_plan.ipynb` from the README at the repository's root.
`python tools/readme.py` writes it; `--check` exits 1 when it differs.
(nbdev's own `nbdev-readme` needs Quarto, which cannot be installed here.)"""
import json, re, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

def _output_text(outputs) -> str:
    "The plain text a reader would see under a code cell."
    out = []
    for o in outputs:
        if o.get('output_type') == 'stream': out.append(''.join(o['text']))
        elif 'data' in o and 'text/plain' in o['data']: out.append(''.join(o['data']['text/plain']))
    return ''.join(out).rstrip('\n')

_CHAPTER_LINK = re.compile(r'\]\((?![a-z][a-z0-9+.-]*:|/|#)([^)\s]+\.ipynb(?:#[^)\s]*)?)\)')

def from_root(markdown) -> str:
    "Markdown of the index with its links to chapters made relative to the repository's root."
    return _CHAPTER_LINK.sub(r'](nbs/\1)', markdown)

def render(nb_path=ROOT / 'nbs' / 'index.ipynb') -> str:
    "The README text of the index notebook."
    blocks = []
    for c in json.loads(Path(nb_path).read_text())['cells']:
        src = ''.join(c['source']).strip('\n')
        if c['cell_type'] == 'markdown': blocks.append(from_root(src))
        elif not src.startswith('#| hide'):
            blocks.append(f'```python\n{src}\n```')
            if out := _output_text(c.get('outputs', [])): blocks.append(f'```\n{out}\n```')
    return '\n\n'.join(blocks) + '\n'

if __name__ == '__main__':
    want, path = render(), ROOT / 'README.md'
    if '--check' in sys.argv:
        if path.read_text() != want: sys.exit('README.md is not what nbs/index.ipynb renders: run python tools/readme.py')
    else: path.write_text(want)
