"""The documentation builds with one command (`mkdocs build`), a page per chapter, each showing its stored outputs, and
reads as the chapters are written: maths as maths, titles with their code, every chapter in the sidebar under its part,
no progress-bar frames."""
import html, json, os, re, subprocess, sys
from html.parser import HTMLParser
from pathlib import Path
import pytest

ROOT = Path(__file__).parents[1]
CHAPTERS = sorted(p for p in (ROOT / 'nbs').glob('*.ipynb') if not p.name.startswith('_') and p.stem != 'index')
PARTS = ['Plan', 'Model', 'Offload', 'Optim', 'DiLoCo', 'Data', 'Agent', 'Train']

@pytest.fixture(scope='module')
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp('site')
    env = os.environ | dict(NO_MKDOCS_2_WARNING='1')
    r = subprocess.run([sys.executable, '-m', 'mkdocs', 'build', '-q', '-d', str(out)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    return out

def test_mkdocs_builds_every_chapter(site):
    missing = [c.stem for c in CHAPTERS if not (site / c.stem / 'index.html').exists()]
    assert not missing, f'no page for {missing}'
    # a stored output, not just the source: the planner's headline plan as the chapter printed it
    assert '520 x H100 (65 nodes)' in (site / 'index.html').read_text()

class ReaderText(HTMLParser):
    """The text a reader sees as prose: everything outside code, preformatted output, scripts and styles, and the
    hidden copy of each code cell's source that the copy button uses."""
    HIDDEN = {'script', 'style', 'pre', 'code', 'textarea', 'title'}
    def __init__(self):
        super().__init__()
        self.depth, self.in_copy, self.chunks = 0, False, []
    def handle_starttag(self, tag, attrs):
        self.depth += tag in self.HIDDEN
        self.in_copy |= tag == 'div' and 'clipboard-copy-txt' in (dict(attrs).get('class') or '')
    def handle_endtag(self, tag):
        self.depth -= tag in self.HIDDEN
        self.in_copy &= tag != 'div'   # the copy's div holds text only
    def handle_data(self, data):
        if not self.depth and not self.in_copy: self.chunks.append(data)

def raw_maths(page_html) -> list[str]:
    "TeX a browser would show as it is written: $…$ or $$…$$ in prose (MathJax's own markup is a script, not prose)."
    p = ReaderText(); p.feed(page_html)
    return re.findall(r'\$\$.+?\$\$|\$[^$\s][^$]*?\$', ' '.join(p.chunks), re.S)

def test_raw_maths_check_can_fail():
    "Control: the check sees TeX in prose, and leaves the same text in code alone."
    assert raw_maths('<p>the update $UV^\\top$ and</p>') == ['$UV^\\top$']
    assert raw_maths('<p>costs <code>$a$</code></p><pre>$HOME $PATH</pre>') == []
    assert raw_maths('<div class="clipboard-copy-txt" id="cell-1">f"$x$"</div><p>after</p>') == []

def test_maths_is_typeset_by_a_mathjax_served_with_the_site(site):
    pages = sorted(site.glob('**/index.html'))
    raw = {p.parent.name: found for p in pages if (found := raw_maths(p.read_text()))}
    assert not raw, f'raw TeX on pages: {raw}'
    optim = (site / '30_optim' / 'index.html').read_text()
    # the issue counted 37 expressions on this page, 54_dedup 14, 53_decontaminate 8
    counts = {name: (site / name / 'index.html').read_text().count('<script type="math/tex')
              for name in ('30_optim', '54_dedup', '53_decontaminate')}
    assert counts['30_optim'] >= 37 and counts['54_dedup'] >= 14 and counts['53_decontaminate'] >= 8, counts
    scripts = re.findall(r'<script src="([^"]+)"', optim)
    mathjax = [s for s in scripts if s.endswith('MathJax.js')]
    assert mathjax and not re.match(r'\w+:|//', mathjax[0]), scripts          # served from the site, not the network
    assert (site / '30_optim' / mathjax[0]).resolve().is_file()
    assert (site / '30_optim' / mathjax[0]).resolve().parent.joinpath('config', 'TeX-AMS-MML_HTMLorMML-full.js').is_file()

def title(nb) -> str:
    "A chapter's first heading as written, without markdown's backticks."
    md = next(''.join(c['source']) for c in json.loads(nb.read_text())['cells'] if c['cell_type'] == 'markdown')
    return re.match(r'#\s+(.+)', md.strip())[1].replace('`', '').strip()

def sidebar(page_html) -> list[tuple[str, str]]:
    "(href, label as text) of every link and section of the primary navigation, in order."
    nav = page_html[page_html.index('md-nav--primary'):page_html.index('md-sidebar--secondary')]
    items = re.findall(r'<(?:a|label) (?:href="([^"]*)" )?class="md-nav__link[^"]*"[^>]*>\s*<span class="md-ellipsis">'
                       r'(.*?)</span>', nav, re.S)
    return [(href, html.unescape(re.sub(r'\s+', ' ', re.sub(r'<[^>]+>', '', label))).strip()) for href, label in items]

def test_sidebar_lists_every_chapter_by_its_title_under_its_part(site):
    items = sidebar((site / 'index.html').read_text())
    assert all(label for _, label in items), f'empty labels: {items}'
    links = {href.rstrip('/'): label for href, label in items if href}
    want = {nb.stem: title(nb) for nb in CHAPTERS}
    assert {k: links.get(k) for k in want} == want
    sections = [label for href, label in items if not href]
    assert [s for s in sections if s in PARTS] == PARTS, sections
    # each chapter sits in the section of its part: '24_run' after 'Offload' and before 'Optim'
    order = [label for _, label in items]
    assert order.index('Offload') < order.index(want['24_run']) < order.index('Optim')
    # the title's code keeps its markup, on the page's own heading and in the sidebar
    run_page = (site / '24_run' / 'index.html').read_text()
    assert 'Assembling a run: <code>apex3.run</code>' in run_page
    assert '<title>Assembling a run: apex3.run - apex3</title>' in run_page

def test_links_between_notebooks_reach_pages(site):
    "A link written for JupyterLab and GitHub (`00_plan.ipynb`) goes to the chapter's page on the site."
    import importlib.util
    from mkdocs.structure.files import File, Files
    from mkdocs.structure.pages import Page
    from mkdocs_jupyter.plugin import NotebookFile
    spec = importlib.util.spec_from_file_location('hooks', ROOT / 'overrides' / 'hooks.py')
    hooks = importlib.util.module_from_spec(spec); spec.loader.exec_module(hooks)
    files = Files([NotebookFile(File(n, str(ROOT / 'nbs'), str(site), True), use_directory_urls=True, site_dir=str(site))
                   for n in ('index.ipynb', '00_plan.ipynb', '30_optim.ipynb')])
    index, optim = (Page(None, files.get_file_from_path(n), {}) for n in ('index.ipynb', '30_optim.ipynb'))
    link = '<a href="00_plan.ipynb#the-planner">x</a> <a href="https://x.org/a.ipynb">y</a>'
    assert hooks.link_pages(link, index, files) == '<a href="00_plan/#the-planner">x</a> <a href="https://x.org/a.ipynb">y</a>'
    assert hooks.link_pages(link, optim, files).startswith('<a href="../00_plan/#the-planner">')
    for page in site.glob('**/index.html'):
        assert not re.findall(r'href="(?![a-z]+:)[^"]*\.ipynb(?:#[^"]*)?"', page.read_text()), page

def test_the_index_links_every_chapter(site):
    "The overview's chapter table links each chapter's page (tools/chapter_table.py writes it)."
    html = (site / 'index.html').read_text()
    assert not [c.stem for c in CHAPTERS if f'href="{c.stem}/' not in html]

def test_printed_output_scrolls_instead_of_wrapping(site):
    css = (site / '_static' / 'book.css').read_text()
    rule = re.search(r'\.jp-OutputArea-output pre[^{]*\{([^}]*)\}', css)
    assert rule and 'white-space: pre;' in rule[1] and 'overflow-x: auto' in rule[1]
    assert '_static/book.css' in (site / '25_bench' / 'index.html').read_text()

@pytest.mark.parametrize('nb', CHAPTERS + [ROOT / 'nbs' / 'index.ipynb'], ids=lambda p: p.name)
def test_stored_outputs_hold_no_progress_frames(nb):
    "A progress bar's frames are settled to its last one (tools/run_nb.py does it): no carriage return is stored."
    for c in json.loads(nb.read_text())['cells']:
        for o in c.get('outputs', []):
            text = ''.join(o.get('text', '')) + ''.join(o.get('data', {}).get('text/plain', ''))
            assert '\r' not in text, f'{nb.name}: progress-bar frames stored: {text[:200]!r} (python tools/run_nb.py --tidy)'

def test_readme_links_reach_chapters_from_the_root():
    "The index links `00_plan.ipynb` (beside it); README.md, at the root, links `nbs/00_plan.ipynb`; web links stay."
    import importlib.util
    spec = importlib.util.spec_from_file_location('readme', ROOT / 'tools' / 'readme.py')
    readme = importlib.util.module_from_spec(spec); spec.loader.exec_module(readme)
    md = '[The planner](00_plan.ipynb#memory) and [nbdev](https://nbdev.fast.ai/x.ipynb)'
    assert readme.from_root(md) == '[The planner](nbs/00_plan.ipynb#memory) and [nbdev](https://nbdev.fast.ai/x.ipynb)'
    assert all((ROOT / link).exists() for link in re.findall(r'\]\((nbs/[^)#]+)', readme.render()))
