"""Host memory as a second tier for one-GPU training: `memory` (the pinned pool, host gradient sums, activations),
`host_optim` (the optimizer's masters and state on the host), `overlap` (its step beside the compute), `plan` (the
one-GPU planner) and `constants` (the sizes both sides share). Each module is one chapter (19 to 21).

The public names of `memory`, `host_optim` and `overlap` also read from here (`from apex3.offload import
OffloadOptimizer`), imported on first use: `import apex3.offload.constants` and the planner stay free of torch."""
import importlib

_HOMES = ('memory', 'host_optim', 'overlap')

def __getattr__(name):
    "A public name of one of `_HOMES`, looked up there each time (so a name patched in its module reads patched here)."
    for home in _HOMES:
        module = importlib.import_module(f'{__name__}.{home}')
        if name in module.__all__: return getattr(module, name)
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
