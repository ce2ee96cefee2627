"""Every generated module keeps lines within 120 characters, chains no statements with `;` and uses no undefined name
(tools/style.py)."""
import importlib.util, pathlib, pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location('style', ROOT / 'tools' / 'style.py')
style = importlib.util.module_from_spec(spec)
spec.loader.exec_module(style)

def test_style_finds_what_it_should(tmp_path):
    "The checker itself: a long line and a chain are found; a `;` inside a string or comment is not."
    f = tmp_path / 'm.py'
    f.write_text('x = 1; y = 2\ns = "a; b"  # c; d\n' + 'z = ' + '1 + ' * 40 + '1\n')
    assert style.style_problems(f) == [(1, '; chain'), (3, f'{4 + 4 * 40 + 1} characters')]

def test_style_finds_undefined_names(tmp_path):
    "A name that only a notebook's test cell imported is undefined in the module; an import, a local, a builtin is not."
    f = tmp_path / 'm.py'
    f.write_text('from typing import Union\ndef f(x: Union[int, None], y: Optional[int] = None):\n    z = len(x)\n'
                 '    return z + w\n')
    assert style.style_problems(f) == [(2, "undefined name 'Optional'"), (4, "undefined name 'w'")]

def test_style_skips_nbdevs_all(tmp_path):
    "nbdev wraps `__all__` at 120 characters and then prefixes `__all__ = `: that statement is not ours to wrap."
    names = ', '.join(f"'name{i:03d}'" for i in range(12))
    f = tmp_path / 'm.py'
    f.write_text(f'__all__ = [{names}]\nx = [{names}]\n')
    assert [i for i, _ in style.style_problems(f)] == [2]

@pytest.mark.parametrize('path', style.module_paths(ROOT / 'apex3'), ids=lambda p: str(p.relative_to(ROOT / 'apex3')))
def test_module_style(path):
    assert style.style_problems(path) == [], f'{path}: fix these in its notebook'
