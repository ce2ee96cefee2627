"""MkDocs hooks for the book (mkdocs.yml `hooks:`): the sidebar is built from the chapters themselves, the maths is
typeset by a MathJax served with the site (no network needed), and links between notebooks point at their pages."""
import html, json, logging, re, shutil
from pathlib import Path

log = logging.getLogger('mkdocs.hooks.book')

# A chapter's part is named by the longest prefix of its file name found here (09_config belongs with the model)
PARTS = {'0': 'Plan', '09': 'Model', '1': 'Model', '2': 'Offload', '3': 'Optim', '4': 'DiLoCo', '5': 'Data',
         '6': 'Agent', '7': 'Train'}
HOME = 'Overview'   # the index's sidebar label: its own title is the site's name, already in the header
MATHJAX_DEST = '_static/mathjax'   # where MathJax's files land in the site; mkdocs.yml's extra_javascript loads them

def chapters(docs_dir) -> list[Path]:
    "The chapters the site shows, in the book's order (their file names)."
    return sorted(p for p in Path(docs_dir).glob('*.ipynb') if not p.name.startswith('_') and p.stem != 'index')

def title_of(nb_path) -> str:
    "A notebook's title as written: its first markdown heading, inline code kept as <code> (nav labels are HTML)."
    for c in json.loads(Path(nb_path).read_text())['cells']:
        if c['cell_type'] != 'markdown': continue
        if m := re.match(r'\s*#\s+(.+)', ''.join(c['source'])):
            pieces = m[1].strip().split('`')   # odd pieces are inline code
            return ''.join(f'<code>{html.escape(s)}</code>' if i % 2 else html.escape(s, quote=False)
                           for i, s in enumerate(pieces))
    raise ValueError(f'{nb_path}: no title (a first markdown cell starting with "# ")')

def part_of(name) -> str:
    "The part a chapter file belongs to, by the longest matching prefix in `PARTS`."
    prefixes = [p for p in PARTS if name.startswith(p)]
    if not prefixes: raise ValueError(f'{name}: no part in overrides/hooks.py PARTS starts its name')
    return PARTS[max(prefixes, key=len)]

def book_nav(docs_dir) -> list:
    "The sidebar: the overview, then every chapter under its part, labelled with its title."
    nav, parts = [{HOME: 'index.ipynb'}], {}
    for p in chapters(docs_dir): parts.setdefault(part_of(p.name), []).append({title_of(p): p.name})
    return nav + [{part: entries} for part, entries in parts.items()]

def on_config(config):
    config['nav'] = book_nav(config['docs_dir'])
    return config

# Maths, as nbconvert leaves it in the page: $…$ and $$…$$ in text (never in code, scripts or tags, skipped whole)
# (a code cell's source is also kept, as text, in a hidden div for the copy button)
_NOT_TEXT = re.compile(r'<(script|style|pre|code|textarea|title)\b.*?</\1\s*>|<div class="clipboard-copy-txt"[^>]*>.*?</div>'
                       r'|<!--.*?-->|<[^>]*>', re.S | re.I)
_MATH = re.compile(r'(?<![\\$])\$\$(?P<display>.+?)(?<!\\)\$\$|(?<![\\$])\$(?P<inline>[^$]+?)(?<![\\$])\$', re.S)
_NBCONVERT_MATHJAX = re.compile(r'<!-- Load mathjax -->.*?<!-- End of mathjax configuration -->', re.S)

def _math_script(m) -> str:
    "One expression as MathJax's own markup: a script it typesets, after a preview of the source for readers without JS."
    display = m['display'] is not None
    tex = html.unescape(m['display'] if display else m['inline']).strip().replace('</', '<\\/')
    mode = '; mode=display' if display else ''
    return f'<span class="MathJax_Preview">{html.escape(tex)}</span><script type="math/tex{mode}">{tex}</script>'

def typeset_markup(page_html) -> str:
    "`page_html` with every $…$ / $$…$$ in its text turned into MathJax scripts; code, tags and scripts untouched."
    out, pos = [], 0
    for m in _NOT_TEXT.finditer(page_html):
        out += [_MATH.sub(_math_script, page_html[pos:m.start()]), m[0]]
        pos = m.end()
    return ''.join(out + [_MATH.sub(_math_script, page_html[pos:])])

_NB_LINK = re.compile(r'href="(?![a-z][a-z0-9+.-]*:|/|#)([^"#?]+\.ipynb)(#[^"]*)?"', re.I)

def link_pages(page_html, page, files) -> str:
    "Links to another notebook (`00_plan.ipynb`, as they read in JupyterLab and on GitHub) go to its page."
    def repl(m):
        src = (Path(page.file.src_uri).parent / m[1]).as_posix()
        target = files.get_file_from_path(src.removeprefix('./'))
        if target is None:
            log.warning(f'{page.file.src_uri}: link to {m[1]}, which is not a page of the site')
            return m[0]
        return f'href="{target.url_relative_to(page.file)}{m[2] or ""}"'
    return _NB_LINK.sub(repl, page_html)

_HEADING = re.compile(r'<h(?P<level>[1-6]) id="(?P<id>[^"]+)"[^>]*>(?P<body>.*?)</h[1-6]>', re.S)
_ANCHOR_OR_SCRIPT = re.compile(r'<a class="anchor-link".*?</a>|<script\b.*?</script>', re.S)

def headings_toc(page_html):
    "The page's table of contents from its rendered headings: their ids and text as shown, inline code kept."
    from mkdocs.structure.toc import get_toc
    root = {'level': 0, 'children': []}
    stack = [root]
    for m in _HEADING.finditer(page_html):
        token = dict(level=int(m['level']), id=m['id'], name=_ANCHOR_OR_SCRIPT.sub('', m['body']).strip(), children=[])
        while stack[-1]['level'] >= token['level']: stack.pop()
        stack[-1]['children'].append(token)
        stack.append(token)
    return get_toc(root['children'])

def on_page_content(page_html, page, config, files):
    page_html = _NBCONVERT_MATHJAX.sub('', page_html)   # its loader points nowhere; the site loads its own copy
    page_html = link_pages(typeset_markup(page_html), page, files)
    page.toc = headings_toc(page_html)   # mkdocs-jupyter's drop inline code from titles and ids
    return page_html

def on_post_build(config):
    "MathJax 2 as jupyter-server-mathjax packages it (the dev extra installs it), served with the site."
    import jupyter_server_mathjax
    src = Path(jupyter_server_mathjax.__file__).parent / 'static'
    shutil.copytree(src, Path(config['site_dir']) / MATHJAX_DEST, dirs_exist_ok=True)
