"The MCP client against real servers in subprocesses: the SDK's MCPServer over stdio and HTTP, and mcp-server-time."
import contextlib, datetime as dt, io, json, shutil, socket, subprocess, sys, time
from pathlib import Path
from zoneinfo import ZoneInfo
import pytest
from apex3.usage import run_command
import apex3.agent.mcp as mcp_mod
from apex3.agent.mcp import (GRACE_S, MCPStartError, MCPToolError, call_main, call_tool, list_tools, mcp_tool_specs,
                             tools_main)
from apex3.agent.tools import Tool

SERVER = [sys.executable, str(Path(__file__).with_name('mcp_test_server.py'))]

def within(fn, seconds, match):
    "`fn` raises MCPToolError matching `match`, and does so within `seconds` + the grace."
    t0 = time.monotonic()
    with pytest.raises(MCPToolError, match=match): fn()
    assert time.monotonic() - t0 < seconds + GRACE_S

def test_stdio_tools_and_calls():
    specs = {s['name']: s for s in mcp_tool_specs(SERVER, timeout=10)}
    assert specs['add']['parameters']['properties']['a']['type'] == 'integer'
    assert specs['shout']['description'] == 'Upper-case a string.'
    assert specs['add']['call'](dict(a=7, b=8)) == str(7 + 8)
    failed = specs['fail']['call'](dict(message='a reason'))
    assert failed.startswith('error: MCP tool fail failed:') and failed.endswith('a reason'), failed

def test_killed_server_is_one_failed_call():
    within(lambda: call_tool('crash', {}, SERVER, timeout=5), 5, 'crash')
    assert call_tool('shout', dict(text='again'), SERVER) == 'AGAIN'  # the next call starts a fresh server

@pytest.mark.parametrize('mode', ['silent', 'garbage'])
def test_a_server_that_never_handshakes(mode):
    within(lambda: list_tools(SERVER + ['--mode', mode], timeout=2), 2, 'listing MCP tools')

def test_hanging_call_times_out():
    within(lambda: call_tool('hang', {}, SERVER, timeout=2), 2, 'no answer within 2 s')

@pytest.fixture
def http_url():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(SERVER + ['--port', str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(('127.0.0.1', port)) == 0: break
        time.sleep(0.1)
    yield f'http://127.0.0.1:{port}/mcp'
    proc.kill()
    proc.wait()

def test_streamable_http(http_url):
    assert 'shout' in [t['name'] for t in list_tools(url=http_url)]
    assert call_tool('add', dict(a=-3, b=3), url=http_url) == '0'
    within(lambda: call_tool('hang', {}, url=http_url, timeout=2), 2, 'no answer within 2 s')

def test_unreachable_url():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        port = s.getsockname()[1]  # closed again: nobody listens here
    within(lambda: list_tools(url=f'http://127.0.0.1:{port}/mcp', timeout=3), 3, 'listing MCP tools')

@pytest.mark.skipif(shutil.which('mcp-server-time') is None, reason='mcp-server-time is missing (the dev extra has it)')
def test_published_time_server_against_zoneinfo():
    server = [shutil.which('mcp-server-time')]
    assert {'get_current_time', 'convert_time'} == {t['name'] for t in list_tools(server)}
    out = json.loads(call_tool('convert_time', dict(source_timezone='America/New_York', time='09:30',
                                                    target_timezone='Asia/Kolkata'), server))
    ny = ZoneInfo('America/New_York')
    start = dt.datetime.combine(dt.datetime.now(ny).date(), dt.time(9, 30), ny)
    assert out['target']['datetime'][:16] == start.astimezone(ZoneInfo('Asia/Kolkata')).isoformat()[:16]
    with pytest.raises(MCPToolError, match='convert_time'):
        call_tool('convert_time', dict(source_timezone='Not/AZone', time='09:30', target_timezone='UTC'), server)

def _cli(fn, *argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err): rc = run_command('agent', fn, list(argv))
    return rc, out.getvalue(), err.getvalue()

def test_cli():
    cmd = ' '.join(SERVER)
    rc, out, err = _cli(tools_main, '--mcp', cmd)
    assert rc == 0 and [t['name'] for t in json.loads(out)][:2] == ['add', 'shout']
    assert _cli(call_main, '--mcp', cmd, 'shout', '{"text": "hi"}')[:2] == (0, 'HI\n')
    for bad in [(tools_main, '--mcp', 'no-such-mcp-server'), (call_main, '--mcp', cmd, 'add', 'not json'),
                (tools_main, '--mcp', cmd, '--mcp-url', 'http://127.0.0.1:1/mcp'), (call_main, '--mcp', cmd)]:
        rc, out, err = _cli(*bad)
        assert rc == 2 and len(err.strip().splitlines()) == 1, (bad, err)

def _one_line(rc, err, want_rc):
    assert rc == want_rc and len(err.strip().splitlines()) == 1 and 'Traceback' not in err, (rc, err)
    return err.strip()

def test_call_checks_arguments_against_the_schema():
    "`apex3 agent call` refuses what the tool's schema refuses, with the loop's own words, before the call."
    cmd = ' '.join(SERVER)
    add = {s['name']: s for s in list_tools(SERVER)}['add']
    for bad in ({'a': 1}, {'a': 'x', 'b': 2}, {'a': 1, 'b': 2.5}):
        rc, out, err = _cli(call_main, '--mcp', cmd, 'add', json.dumps(bad))
        want = Tool.from_spec(dict(add, call=None)).invalid(bad)   # the check the agent loop makes
        assert want and _one_line(rc, err, 2) == f'apex3 agent: error: {want}', (bad, err)
        with pytest.raises(MCPToolError, match='validation error'):   # control: unchecked, the server refuses
            call_tool('add', bad, SERVER)
    assert _cli(call_main, '--mcp', cmd, 'add', '{"a": 2, "b": 3}')[:2] == (0, '5\n')
    assert 'has no tool' in _one_line(*_cli(call_main, '--mcp', cmd, 'nope')[::2], 2)

def test_a_server_that_exits_at_start():
    "Its exit status and its last words, as one line and status 2; the shim is what makes the status known."
    cmd = ' '.join(SERVER + ['--mode', 'exit'])
    for fn, argv in ((call_main, ['add', '{"a": 1, "b": 2}']), (tools_main, [])):
        rc, out, err = _cli(fn, '--mcp', cmd, *argv)
        line = _one_line(rc, err, 2)
        assert 'the server exited with status 3 before it answered' in line, line
        assert line.endswith('its stderr ends: reading settings from the environment | '
                             'fatal: TEST_SERVER_KEY is not set'), line
    with pytest.raises(MCPStartError): call_tool('add', dict(a=1, b=2), SERVER + ['--mode', 'exit'])
    crash = _cli(call_main, '--mcp', ' '.join(SERVER), 'crash')   # exiting mid-call is the tool failing: status 1
    assert 'exited with status 3 while it was answering' in _one_line(crash[0], crash[2], 1)

def test_without_the_shim_the_exit_is_only_a_closed_connection(monkeypatch):
    "The control: the SDK alone reports a server that exits at start as a closed connection, with no status."
    monkeypatch.setattr(mcp_mod, '_under_shim', lambda target, status_path: target)
    with pytest.raises(MCPToolError) as e: call_tool('add', dict(a=1, b=2), SERVER + ['--mode', 'exit'])
    assert 'Connection closed' in str(e.value) and 'status' not in str(e.value) and type(e.value) is MCPToolError

RAW_SERVER = '''
# a bare JSON-RPC stdio server: argv[1] 'error' answers every call with JSON-RPC error -32000 and its own words;
# 'bytes' writes bytes that are not UTF-8 on its stderr and exits 3
import json, sys
if sys.argv[1] == 'bytes':
    sys.stderr.buffer.write(b'fatal: \\xff\\xfe bad key\\n'); sys.stderr.flush(); sys.exit(3)
for line in sys.stdin:
    m = json.loads(line)
    if 'id' not in m: continue
    if m['method'] == 'initialize':
        r = {'protocolVersion': m['params']['protocolVersion'], 'capabilities': {'tools': {}},
             'serverInfo': {'name': 'raw', 'version': '1'}}
    elif m['method'] == 'tools/list': r = {'tools': [{'name': 'echo', 'inputSchema': {'type': 'object'}}]}
    else:
        error = {'code': -32000, 'message': 'the API key is invalid'}
        print(json.dumps({'jsonrpc': '2.0', 'id': m['id'], 'error': error}), flush=True)
        continue
    print(json.dumps({'jsonrpc': '2.0', 'id': m['id'], 'result': r}), flush=True)
'''

def test_a_servers_own_error_and_its_undecodable_last_words(tmp_path):
    """A server's error -32000 keeps its message (not "the server exited"); a server that exits after writing bytes that
    are not UTF-8 on its stderr is the usual one line, its words with a replacement character."""
    (tmp_path / 'raw.py').write_text(RAW_SERVER)
    cmd = f'{sys.executable} {tmp_path / "raw.py"}'
    line = _one_line(*_cli(call_main, '--mcp', cmd + ' error', 'echo', '{}')[::2], 1)
    assert 'the API key is invalid' in line and 'exited' not in line, line
    line = _one_line(*_cli(tools_main, '--mcp', cmd + ' bytes')[::2], 2)
    assert 'exited with status 3 before it answered' in line and 'fatal: \ufffd\ufffd bad key' in line, line

def test_a_schema_the_validator_cannot_apply_is_a_refusal_not_a_crash():
    "A server's schema with a $ref nobody can resolve: the call is refused in words the model reads."
    tool = lambda prop: Tool.from_spec({'name': 'r', 'description': 'd', 'call': lambda a: 'ran',
                                        'parameters': {'type': 'object', 'properties': {'s': prop}}})
    assert tool({'$ref': 'http://127.0.0.1:1/x.json'}).call({'s': 'x'}).startswith('error: the schema of r cannot be')
    assert tool({'type': 'string'}).call({'s': 'x'}) == 'ran'   # the control: a schema it can apply
