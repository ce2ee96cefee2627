"The agent sandbox: the escape suite per backend (printed as N/N blocked), its negative control, and the CLI."
import contextlib, io, os, shutil, tempfile
import pytest
from apex3.usage import UsageError, run_command
from apex3.agent.sandbox import (SUITE_LIMITS as SUITE, BwrapSandbox, DockerSandbox, Limits, SandboxResult,
                                 escape_suite, escape_table, get_sandbox, sandbox_main, _docker_client, _run_limited)

SUITE_LIMITS = Limits(**SUITE)
needs_bwrap = pytest.mark.skipif(shutil.which('bwrap') is None and not os.environ.get('CI'),
                                 reason='bubblewrap is not installed (tools/ci_agent_setup.sh installs it)')

@needs_bwrap
def test_bwrap_escape_suite_from_the_cli():
    rc, out, err = _cli('--escape-suite')
    print('\n' + out)
    rows = out.strip().splitlines()
    assert len(rows) == 15 + 1
    escaped = [line.split('  ')[0] for line in rows[:-1] if ' ESCAPED ' in line]
    assert escaped == ([] if os.geteuid() == 0 else ['memory, forked'])  # the cgroups need root
    assert rows[-1] == ('bwrap: 15/15 blocked' if os.geteuid() == 0 else 'bwrap: 14/15 blocked')
    assert rc == (0 if os.geteuid() == 0 else 1)

def test_docker_escape_suite():
    try: _docker_client()
    except UsageError as e:
        print(f'docker escape suite skipped: {e}')
        pytest.skip(str(e))
    with DockerSandbox(SUITE_LIMITS) as sb:
        r = sb.run(['sh', '-c', 'cat; echo e >&2; head -c 3000000 /dev/zero; exit 4'], stdin='x')
        assert (r.stdout[:1], r.stderr, r.exit_code, r.truncated) == ('x', 'e\n', 4, True)
        assert len(r.stdout) == sb.limits.output_bytes
        rows = escape_suite(sb)
    print('\n' + escape_table(rows, 'docker'))
    assert [r['attack'] for r in rows if not r['blocked']] == []

class NullSandbox:
    "A plain host subprocess: the attacks must escape it, or the suite's probes are broken."
    backend = 'none'
    def __init__(self, workdir): self.workdir, self.limits = workdir, Limits(wall_s=20)
    def run(self, cmd, stdin=None, timeout=None):
        rc, out, err, timed_out, cut, secs = _run_limited(cmd, stdin, timeout or 20, 1 << 20, cwd=self.workdir)
        return SandboxResult(out, err, rc, timed_out, secs, cut, self.backend)

def test_suite_catches_a_null_sandbox(tmp_path):
    names = ['tcp egress', 'dns egress', 'write outside', 'read secret', 'symlink escape', '.. escape']
    rows = escape_suite(NullSandbox(str(tmp_path)), names)
    print('\n' + escape_table(rows, 'none'))
    assert [r['attack'] for r in rows if r['blocked']] == []

@needs_bwrap
@needs_bwrap
@pytest.mark.skipif(os.geteuid() != 0, reason='the sandbox makes cgroups only as root')
def test_forked_memory_bomb_needs_the_cgroup():
    class RlimitsOnly(BwrapSandbox):
        def _cgroups(self): return None
    for cls, blocked in [(RlimitsOnly, False), (BwrapSandbox, True)]:
        with cls(SUITE_LIMITS) as sb: assert escape_suite(sb, ['memory, forked'])[0]['blocked'] == blocked

@needs_bwrap
def test_workspace_persists_and_is_the_only_writable_place():
    with get_sandbox(wall_s=10) as sb:
        assert sb.run(['sh', '-c', 'echo 1 > a']).ok
        assert sb.run(['cat', 'a']).stdout == '1\n'
        assert not sb.run(['sh', '-c', 'echo 1 > /usr/a']).ok
        r = sb.run(['sh', '-c', 'head -c 5000000 /dev/zero | tr "\\0" x'])
        assert r.truncated and len(r.stdout) == sb.limits.output_bytes
    assert not os.path.exists(sb.workdir)  # a sandbox's own workspace goes with it

def _cli(*argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = run_command('agent sandbox', sandbox_main, list(argv))
    return rc, out.getvalue(), err.getvalue()

@needs_bwrap
def test_cli_runs_a_command():
    with tempfile.TemporaryDirectory() as d:
        rc, out, err = _cli('--workdir', d, '--', 'sh', '-c', 'echo hello > f; cat f; exit 3')
        assert (rc, out) == (3, 'hello\n') and '[sandbox bwrap] exit 3' in err
        assert open(os.path.join(d, 'f')).read() == 'hello\n'

@pytest.mark.parametrize('argv', [[], ['true'], ['--memory', 'lots', '--', 'true'], ['--backend', 'vm', '--', 'true'],
                                  ['--workdir', '/nonexistent/dir', '--', 'true'], ['--']])
def test_cli_bad_input_is_one_line(argv):
    rc, out, err = _cli(*argv)
    assert rc == 2 and len(err.strip().splitlines()) == 1 and err.startswith('apex3 agent sandbox: error:')

def test_missing_backend_is_a_usage_error():
    with pytest.raises(UsageError, match='bubblewrap is not installed'): BwrapSandbox(bwrap='/nonexistent/bwrap')
    with pytest.raises(UsageError, match='unknown sandbox backend'): get_sandbox('lxc')
