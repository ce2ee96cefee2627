"""Memory running out while a command builds its model or cache, and sizes no memory could hold, are one line, status 2.

Judged from outside, as a user meets them: real `apex3` processes under an address-space limit (`RLIMIT_AS`), so an
allocation past it fails at once, as one past the host's memory does, and never takes this machine's memory. Each
control runs the same command with the check under test switched off: a traceback, or the work the check forestalls.
"""
import os, resource, subprocess, sys
from pathlib import Path
import pytest

ROOT = Path(__file__).parents[1]
LIMIT = 8 * 2**30   # bytes of address space: torch and a tiny model fit, a billion-row embedding does not
# the console script's entry point, after the Python line given as its first argument (a switch, or `pass`)
APEX3 = 'import sys; exec(sys.argv.pop(1)); from apex3.cli import main; sys.exit(main(sys.argv[1:]))'
MEMORY_OFF = 'import apex3.usage as u; u.is_out_of_memory = lambda e: False'
TRAIN = ['--config', 'tiny', '--seq-len', '32', '--micro-bs', '2', '--device', 'cpu', '--ce-impl', 'torch',
         '--progress', 'off', '--total-tokens', '1000']

def _limited():
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))

def apex3(*argv, switch='pass', cwd=None):
    "`apex3 *argv` in a fresh process under the address-space limit, `switch` run first."
    env = {**os.environ, 'PYTHONPATH': str(ROOT), 'OMP_NUM_THREADS': '1'}
    return subprocess.run([sys.executable, '-c', APEX3, switch, *map(str, argv)], capture_output=True, text=True,
                          env=env, timeout=300, preexec_fn=_limited, cwd=cwd)

def one_line(p, *says):
    "The process ended with status 2 and one stderr line holding each of `says`."
    assert p.returncode == 2 and p.stderr.count('\n') == 1 and all(s in p.stderr for s in says), p.stderr[-2000:]

def a_traceback(p):
    assert p.returncode == 1 and 'Traceback' in p.stderr and p.stderr.count('\n') > 10, p.stderr[-2000:]

@pytest.fixture(scope='module')
def shards(tmp_path_factory):
    from apex3.train_io import byte_shards
    d = byte_shards(tmp_path_factory.mktemp('bytes'), 50_000)
    return f'std=1:{d}/shard-0000[0-2].bin'

@pytest.fixture(scope='module')
def tiny_ckpt(tmp_path_factory):
    "A tiny byte-level model saved as `apex3 train` saves one, with its tokenizer's data meta."
    import torch
    from apex3.ckpt import save_checkpoint
    from apex3.config import get_config
    from apex3.model import Transformer
    from apex3.train import train_parser
    from apex3.train_io import byte_shards
    d = tmp_path_factory.mktemp('ckpt')
    shards = byte_shards(d / 'bytes', 20_000, n_shards=1)
    flags = train_parser().parse_args(['--config', 'tiny', '--set', 'vocab_size=257', '--eos-id', '256',
                                       '--data', f'{shards}/shard-*.bin', '--total-tokens', '1000'])
    torch.manual_seed(0)
    model = Transformer(get_config('tiny', ['vocab_size=257', 'eos_id=256', 'max_docs=16']))
    save_checkpoint(d / 'ckpt', 0, {'model': model.state_dict(), 'args': vars(flags)})
    return d / 'ckpt'

HOST = ('host memory ran out', "can't allocate memory")

def test_a_model_past_host_memory_is_one_line(shards):
    "bench and train building a billion-row embedding (256 GB): which memory ran out and what to make smaller."
    one_line(apex3('bench', '--device', 'cpu', '--set', 'vocab_size=1000000000'), *HOST, '--micro-bs')
    one_line(apex3('train', *TRAIN, '--data', shards, '--set', 'vocab_size=1000000000'), *HOST, '--micro-bs')
    a_traceback(apex3('bench', '--device', 'cpu', '--set', 'vocab_size=1000000000', switch=MEMORY_OFF))

def test_a_kv_cache_past_host_memory_is_one_line(tiny_ckpt):
    "`apex3 serve` asked for a cache of 2**20 positions in each of 1024 rows: the line names both flags."
    argv = ('serve', tiny_ckpt, '--device', 'cpu', '--port', '0', '--max-len', 1 << 20, '--max-batch', 1024)
    one_line(apex3(*argv), *HOST, '--max-len or --max-batch')
    a_traceback(apex3(*argv, switch=MEMORY_OFF))

def test_a_size_past_int64_is_a_usage_error(shards):
    "`--set vocab_size=` twenty nines is refused where the config is read; past the check torch prints a C++ stack."
    huge = 'vocab_size=' + '9' * 20
    for cmd in (['bench', '--device', 'cpu'], ['train', *TRAIN, '--data', shards]):
        one_line(apex3(*cmd, '--set', huge), f'{huge} is past the largest whole number')
    control = apex3('bench', '--device', 'cpu', '--set', huge, switch="import apex3.config as c; c.INT_MAX = 10**30")
    assert control.returncode == 1 and 'Overflow when unpacking long' in control.stderr, control.stderr[-2000:]

BENCH = ['bench', '--config', 'tiny', '--device', 'cpu', '--ce-impl', 'torch', '--steps', '1', '--warmup', '0']

def test_an_unwritable_json_is_refused_before_the_benchmark(tmp_path):
    "`--json` under a file: one line and no benchmark; the control, without the probe, benchmarks first and then fails."
    (tmp_path / 'file').write_text('')
    p = apex3(*BENCH, '--json', tmp_path / 'file' / 'b.jsonl')
    one_line(p, str(tmp_path / 'file'))
    assert 'micro_s_median=' not in p.stdout and 'step 0' not in p.stderr, p.stdout
    control = apex3(*BENCH, '--json', tmp_path / 'file' / 'b.jsonl',
                    switch='import apex3.bench as b; b.probe_appendable = lambda path: None')
    assert control.returncode == 2 and 'micro_s_median=' in control.stdout, (control.stdout, control.stderr[-2000:])
    ok = apex3(*BENCH, '--json', tmp_path / 'out' / 'b.jsonl')   # a folder that can be made is made, and written
    assert ok.returncode == 0 and (tmp_path / 'out' / 'b.jsonl').read_text().count('\n') == 1, ok.stderr[-2000:]
