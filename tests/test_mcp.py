"The MCP client against real servers in subprocesses: the SDK's MCPServer over stdio and HTTP, and mcp-server-time."
import contextlib, datetime as dt, io, json, os, re, shlex, shutil, socket, subprocess, sys, time
from pathlib import Path
from zoneinfo import ZoneInfo
import pytest
from apex3.usage import run_command
import apex3.agent.mcp as mcp_mod
from apex3.agent.mcp import (GRACE_S, MCPStartError, MCPToolError, call_main, call_tool, list_tools, mcp_tool_specs,
                             tools_main)
import apex3.agent.tools as tools_mod
from apex3.agent.loop import ScriptedModel, run_agent
from apex3.agent.tools import COMPILE_MB, COMPILE_S, PATTERN_S, Tool

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
    assert 'error: MCP tool crash: the server exited with status 3 while it was answering' in _one_line(
        crash[0], crash[2], 1)

def test_without_the_shim_the_exit_is_only_a_closed_connection(monkeypatch):
    "The control: the SDK alone reports a server that exits at start as a closed connection, with no status."
    monkeypatch.setattr(mcp_mod, '_under_shim', lambda target, status_path: target)
    with pytest.raises(MCPToolError) as e: call_tool('add', dict(a=1, b=2), SERVER + ['--mode', 'exit'])
    assert 'Connection closed' in str(e.value) and 'status' not in str(e.value) and type(e.value) is MCPToolError

RAW_SERVER = '''
# a bare JSON-RPC stdio server with one tool, echo: argv[1] 'error' answers every call with JSON-RPC error -32000 and
# its own words; 'bytes' writes bytes that are not UTF-8 on its stderr and exits 3; 'pattern' gives echo's argument
# `s` the pattern argv[2] and echoes; 'schema' gives echo the input schema argv[2] (JSON) and echoes
import json, sys
if sys.argv[1] == 'bytes':
    sys.stderr.buffer.write(b'fatal: \\xff\\xfe bad key\\n'); sys.stderr.flush(); sys.exit(3)
schema = {'type': 'object'}
if sys.argv[1] == 'pattern': schema['properties'] = {'s': {'type': 'string', 'pattern': sys.argv[2]}}
if sys.argv[1] == 'schema': schema = json.loads(sys.argv[2])
for line in sys.stdin:
    m = json.loads(line)
    if 'id' not in m: continue
    if m['method'] == 'initialize':
        r = {'protocolVersion': m['params']['protocolVersion'], 'capabilities': {'tools': {}},
             'serverInfo': {'name': 'raw', 'version': '1'}}
    elif m['method'] == 'tools/list': r = {'tools': [{'name': 'echo', 'inputSchema': schema}]}
    elif sys.argv[1] in ('pattern', 'schema'): r = {'content': [{'type': 'text', 'text': 'echoed'}]}
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

BACKTRACKS = 'a' * 40 + '!'   # 2**40 ways for (a+)+ or (a|a)* to fail on the '!'
UNBOUNDED_CHECK = ('import jsonschema, sys\n'
                   'print("ready", flush=True)\n'
                   'schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": sys.argv[1]}}}\n'
                   'print(list(jsonschema.Draft202012Validator(schema).iter_errors({"s": sys.argv[2]})))')

def _still_checking_after(seconds, code, *argv):
    """Whether `python -c code *argv` is still running `seconds` after it printed "ready" (its imports done): a check
    that cannot be bounded in this process (`re` holds the GIL) runs in one that can be killed."""
    env = {**os.environ, 'PYTHONPATH': str(Path(__file__).parents[1])}
    with subprocess.Popen([sys.executable, '-c', code, *argv], stdout=subprocess.PIPE, text=True, env=env) as p:
        assert p.stdout.readline() == 'ready\n'
        try: p.wait(seconds)
        except subprocess.TimeoutExpired: return True
        finally: p.kill()
    return False

@pytest.mark.parametrize('pattern', ['^(a+)+$', '^(a|a)*$'])
def test_a_backtracking_schema_pattern_is_a_bounded_refusal(tmp_path, pattern):
    """A server's schema pattern that backtracks exponentially: `apex3 agent call` answers within its --timeout (plus
    the grace) with status 2 and one line, and the loop's `Tool.call` within the tool's timeout. The control: the same
    check by jsonschema alone (`re`) has not finished when that timeout is up."""
    (tmp_path / 'server.py').write_text(RAW_SERVER)
    cmd, timeout = f'{sys.executable} {tmp_path / "server.py"} pattern {shlex.quote(pattern)}', 3
    t0 = time.monotonic()
    rc, out, err = _cli(call_main, '--mcp', cmd, '--timeout', str(timeout), 'echo', json.dumps({'s': BACKTRACKS}))
    assert time.monotonic() - t0 < timeout + GRACE_S
    assert _one_line(rc, err, 2).startswith('apex3 agent: error: invalid arguments for echo: '), err
    spec = {s['name']: s for s in list_tools(cmd)}['echo']
    tool = Tool.from_spec(dict(spec, call=lambda args: 'ran', timeout=timeout))
    t0 = time.monotonic()
    assert tool.call({'s': BACKTRACKS}).startswith('error: invalid arguments for echo: ')
    assert time.monotonic() - t0 < timeout
    assert tool.call({'s': 'aaa'}) == 'ran'   # a string the pattern takes still passes
    assert _still_checking_after(timeout, UNBOUNDED_CHECK, pattern, BACKTRACKS)   # the control: jsonschema alone

DRAFT7 = {'type': 'object', 'properties': {'s': {'$schema': 'http://json-schema.org/draft-07/schema#',
                                                 'type': 'string', 'pattern': '^(a|a)*$'}}}
KEPT_SCHEMA_CHECK = ('import json, sys\nfrom apex3.agent.tools import _validator_class\n'
                     'print("ready", flush=True)\n'
                     'schema = json.loads(sys.argv[1])\n'
                     'print(list(_validator_class("t", schema)(schema).iter_errors({"s": sys.argv[2]})))')

def test_a_schema_inside_the_schema_cannot_switch_the_check_back_to_re():
    """A `$schema` of draft 7 on one property: the check stays bounded. The control: the same validator class, given
    the schema with its `$schema` kept, switches to jsonschema's draft 7 (`re`) and has not finished in that time."""
    tool = Tool.from_spec(dict(name='echo', parameters=DRAFT7, call=lambda args: 'ran', timeout=3))
    t0 = time.monotonic()
    assert tool.call({'s': BACKTRACKS}).startswith('error: invalid arguments for echo: the schema pattern')
    assert time.monotonic() - t0 < tool.timeout
    assert _still_checking_after(tool.timeout, KEPT_SCHEMA_CHECK, json.dumps(DRAFT7), BACKTRACKS)

UNIQUE = {'type': 'object', 'properties': {'xs': {'type': 'array', 'uniqueItems': True}}}
PAIRWISE_CHECK = ('import jsonschema, sys\n'
                  'xs = [{"k": i} for i in range(int(sys.argv[1]))]\n'
                  'print("ready", flush=True)\n'
                  'print(list(jsonschema.Draft202012Validator(' + repr(UNIQUE) + ').iter_errors({"xs": xs})))')

def test_unique_items_of_many_objects_is_checked_within_the_timeout():
    """`uniqueItems` on 8,000 objects the model wrote: the check answers within the tool's timeout, and still finds a
    duplicate (1 and 1.0 are one value, 1 and true are two). The control: jsonschema's pairwise check is still
    running."""
    tool = Tool.from_spec(dict(name='u', parameters=UNIQUE, call=lambda args: 'ran', timeout=3))
    t0 = time.monotonic()
    assert tool.call({'xs': [{'k': i} for i in range(8000)]}) == 'ran'
    assert time.monotonic() - t0 < tool.timeout
    assert tool.call({'xs': [{'k': [1]}, {'k': [1.0]}]}).endswith('has non-unique elements')
    assert tool.call({'xs': [1, True, None, 0, False]}) == 'ran'
    assert _still_checking_after(tool.timeout, PAIRWISE_CHECK, '8000')

def _branching(depth):
    "A schema of `$ref`s to `anyOf`s of two `$ref`s, `depth` deep (3 KB at 40): 2**depth branches for a non-string."
    defs = {f'n{i}': {'anyOf': [{'$ref': f'#/$defs/n{i + 1}'}] * 2} for i in range(depth)}
    return {'type': 'object', '$defs': {**defs, f'n{depth}': {'type': 'string'}},
            'properties': {'s': {'$ref': '#/$defs/n0'}}}

BRANCHING_CHECK = ('import json, sys, jsonschema\nprint("ready", flush=True)\n'
                   'schema = json.loads(sys.argv[1])\n'
                   'print(list(jsonschema.Draft202012Validator(schema).iter_errors({"s": None})))')

def test_a_schema_that_branches_without_end_is_a_bounded_refusal():
    """A server's schema whose `$ref`s branch 2**40 ways: an argument that fits no branch is refused in one line within
    the tool's timeout, and one that fits passes. The control: jsonschema alone has not finished in that time."""
    schema = _branching(40)
    tool = Tool.from_spec(dict(name='echo', parameters=schema, call=lambda args: 'ran', timeout=2))
    t0 = time.monotonic()
    refused = tool.call({'s': None})
    assert time.monotonic() - t0 < tool.timeout + 1.5, refused   # (slack for a loaded machine: CI ran 0.73 s late)
    assert refused.startswith('error: invalid arguments for echo: checking them against the schema took more'), refused
    assert tool.call({'s': 'fits'}) == 'ran'
    assert Tool.from_spec(dict(name='e', parameters=_branching(3), call=None)).invalid({'s': None}).endswith(
        'None is not valid under any of the given schemas')   # a shallow one is still checked to the end
    assert _still_checking_after(tool.timeout, BRANCHING_CHECK, json.dumps(schema))

LETTERS = {'type': 'object', 'required': ['n'],
           'properties': {'s': {'type': 'string', 'pattern': r'^\p{L}+$'}, 'n': {'type': 'integer'}}}

def test_a_pattern_regex_reads_but_re_does_not_keeps_the_schema(caplog):
    """A server's pattern `\\p{L}` (ECMA-262; `re` refuses it): the schema still checks the arguments, the pattern and the
    rest (a missing `n`); a pattern no engine reads is still 'not a JSON schema'. The control: jsonschema's own schema
    check, by `re`, refuses the schema, which the tool once read as 'any object' and let every argument through."""
    tool = Tool.from_spec(dict(name='echo', parameters=LETTERS, call=lambda args: 'ran'))
    assert tool.call({'s': 'Zürich', 'n': 1}) == 'ran'
    assert tool.call({'s': '42', 'n': 1}).startswith("error: invalid arguments for echo: s: '42' does not match")
    assert tool.call({'s': 'abc'}) == "error: invalid arguments for echo: arguments: 'n' is a required property"
    assert not [r for r in caplog.records if 'not a JSON schema' in r.getMessage()]
    broken = Tool.from_spec(dict(name='b', parameters={'properties': {'s': {'pattern': '('}}}, call=lambda a: 'ran'))
    assert broken.call({'s': 'x'}) == 'ran' and 'not a JSON schema' in caplog.records[-1].getMessage()
    import jsonschema
    with pytest.raises(jsonschema.SchemaError, match="is not a 'regex'"):   # the control
        jsonschema.Draft202012Validator.check_schema(LETTERS)

def _raw_server_with(tmp_path, schema):
    "The bare server's command line, its tool `echo` under the input schema `schema`."
    (tmp_path / 'server.py').write_text(RAW_SERVER)
    return f'{sys.executable} {tmp_path / "server.py"} schema {shlex.quote(json.dumps(schema))}'

def test_the_argument_check_of_agent_call_ends_with_its_timeout(tmp_path):
    """`apex3 agent call --timeout 2` with the schema that branches 2**40 ways: the refusal comes within those 2 s (plus
    slack for a loaded machine), not after the check's own `CHECK_S`. The control: with --timeout 5 the same check
    runs to that session's end, so a longer --timeout does give the check longer."""
    cmd = _raw_server_with(tmp_path, _branching(40))
    def refused_after(timeout):
        t0 = time.monotonic()
        rc, out, err = _cli(call_main, '--mcp', cmd, '--timeout', str(timeout), 'echo', '{"s": null}')
        assert 'checking them against the schema took more than' in _one_line(rc, err, 2), err
        return time.monotonic() - t0
    assert refused_after(2) < 2 + 1.5
    assert refused_after(5) > 4.5   # the control

def test_an_integer_past_pythons_digits_is_refused_for_what_it_is(tmp_path):
    """5,000 digits in the JSON arguments (past Python's limit for turning text into an integer): `apex3 agent call`
    says so in one line, exit 2, not a traceback; `Tool.call` with such an integer names the argument and its digits,
    not the schema. The control: 100 digits are read and checked against the schema as any number is."""
    schema = {'type': 'object', 'properties': {'n': {'type': 'integer', 'maximum': 5}}}
    cmd, limit = _raw_server_with(tmp_path, schema), sys.get_int_max_str_digits()
    call = lambda digits: _cli(call_main, '--mcp', cmd, 'echo', '{"n": %s}' % ('1' * digits))
    line = _one_line(*call(5000)[::2], 2)
    assert line.endswith(f'tool arguments hold an integer of more than {limit} digits, more than Python converts to '
                         'or from text'), line
    assert _one_line(*call(100)[::2], 2).endswith('is greater than the maximum of 5')   # the control
    tool = Tool.from_spec(dict(name='echo', parameters=schema, call=lambda args: 'ran'))
    assert tool.call({'n': 10 ** 5000}) == (f'error: invalid arguments for echo: n: an integer of more than {limit} '
                                            'digits, more than Python converts to or from text; the call was not made')
    assert tool.call({'n': 10 ** 100}).endswith('is greater than the maximum of 5')   # the control
    assert tool.call({'n': 5}) == 'ran'

SHARED_CORE_CHECK = ('import json, os, sys, time, regex\n'
                     'os.sched_setaffinity(0, {int(sys.argv[1])})\n'
                     'from apex3.agent.tools import Tool\n'
                     'pattern, text = "^(a|a)*$", "a" * 40 + "!"\n'
                     't0 = time.monotonic()\n'
                     'try: regex.search(pattern, text, timeout=1.0)\n'
                     'except TimeoutError: pass\n'
                     'alone = time.monotonic() - t0\n'
                     'schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": pattern}}}\n'
                     'tool = Tool.from_spec(dict(name="echo", parameters=schema, call=None))\n'
                     't0 = time.monotonic()\n'
                     'refused = tool.invalid({"s": text})\n'
                     'print(json.dumps([alone, time.monotonic() - t0, refused]))')

def test_the_pattern_budget_is_wall_time_on_a_busy_core():
    """On a core shared with a busy process, a backtracking pattern is refused within `PATTERN_S` of wall time (plus
    slack). The control: `regex.search` alone, with the same timeout, returns well after it, since `regex` counts the
    process's CPU time, of which this process gets about half."""
    core = max(os.sched_getaffinity(0))
    busy = subprocess.Popen([sys.executable, '-c', f'import os\nos.sched_setaffinity(0, {{{core}}})\nwhile True: pass'])
    env = {**os.environ, 'PYTHONPATH': str(Path(__file__).parents[1])}
    try: p = subprocess.run([sys.executable, '-c', SHARED_CORE_CHECK, str(core)], capture_output=True, text=True,
                            env=env, timeout=120)
    finally:
        busy.kill(); busy.wait()
    alone, checked, refused = json.loads(p.stdout)
    assert refused.startswith("invalid arguments for echo: the schema pattern '^(a|a)*$' did not finish"), refused
    assert checked < PATTERN_S + 0.4 < alone, (checked, alone)   # alone: the control

COMPILE_BOMB = '(?:(?:a{1000}){1000}){1000}'   # 27 characters that `regex` writes out as a billion `a`s
UNBUDGETED_COMPILE = ('import regex, resource, sys\n'
                      'resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n'
                      'try: regex.compile(sys.argv[1])\n'
                      'except MemoryError: sys.exit("more than 1 GiB")\n')

def test_a_pattern_that_costs_too_much_to_compile_is_a_bounded_refusal(tmp_path):
    """A server's pattern of 27 characters that `regex` would compile into about 260 GB: `apex3 agent call` refuses it
    in one line that names the tool and the parameter, exit 2, within `COMPILE_S` (plus the session's start and slack
    for a loaded machine); a plain pattern from the same server is accepted and the call made. The control: compiled
    without the budget, in 1 GiB of address space, the same pattern runs out of memory."""
    (tmp_path / 'server.py').write_text(RAW_SERVER)
    server = lambda pattern: f'{sys.executable} {tmp_path / "server.py"} pattern {shlex.quote(pattern)}'
    t0 = time.monotonic()
    rc, out, err = _cli(call_main, '--mcp', server(COMPILE_BOMB), 'echo', '{"s": "a"}')
    assert time.monotonic() - t0 < COMPILE_S + 3
    assert _one_line(rc, err, 2) == ("apex3 agent: error: the schema of echo cannot be checked: the pattern "
                                     f"'{COMPILE_BOMB}' of parameter s needs more than {COMPILE_MB} MiB to compile; "
                                     "the call was not made"), err
    assert _cli(call_main, '--mcp', server('^a{1,3}$'), 'echo', '{"s": "a"}')[:2] == (0, 'echoed\n')   # a plain one
    alone = subprocess.run([sys.executable, '-c', UNBUDGETED_COMPILE, COMPILE_BOMB], capture_output=True, text=True)
    assert alone.returncode == 1 and alone.stderr.strip() == 'more than 1 GiB', alone.stderr   # the control

def _pattern_tool(name, pattern, timeout=30):
    return Tool.from_spec(dict(name=name, call=lambda args: f'{name} ran', timeout=timeout, parameters={
        'type': 'object', 'properties': {'s': {'type': 'string', 'pattern': pattern}}}))

SLOW_COMPILE = ('import regex, sys\n'
                'pattern = "|".join(map(str, range(int(sys.argv[1]))))\n'
                'print("ready", flush=True)\n'
                'regex.compile(pattern)')

def test_a_pattern_slow_to_compile_is_refused_on_time(monkeypatch):
    """With memory to spare, a pattern of 1.3 MB (200,000 numbers in an alternation) is refused by the time budget:
    building the tool and calling it take the tool's 1 s timeout (plus slack for a loaded machine), not the compile's
    seconds. The control: the same compile alone is still running then."""
    monkeypatch.setattr(tools_mod, 'COMPILE_MB', 4096)
    t0 = time.monotonic()
    refused = _pattern_tool('echo', '|'.join(map(str, range(200_000))), timeout=1).call({'s': '7'})
    assert time.monotonic() - t0 < 1 + 1.5, refused
    assert refused.startswith("error: the schema of echo cannot be checked: the pattern '0|1|2|"), refused
    assert refused.endswith('of parameter s did not compile within 1 s; the call was not made'), refused
    assert _still_checking_after(1 + 1.5, SLOW_COMPILE, '200000')   # the control

def test_the_agent_goes_on_with_its_other_tools():
    """A turn that calls a tool whose pattern costs too much to compile, and two others: that call gets the refusal as
    its result, the others run, and the model's next turn answers."""
    calls = ''.join(f'<tool_call>\n{{"name": "{n}", "arguments": {{"s": "aa"}}}}\n</tool_call>'
                    for n in ('bomb', 'plain', 'counted'))
    tools = [_pattern_tool('bomb', COMPILE_BOMB), _pattern_tool('plain', '^a+$'), _pattern_tool('counted', '^a{2}$')]
    res = run_agent(ScriptedModel([calls + '<|im_end|>', 'done<|im_end|>']), tools,
                    [{'role': 'user', 'content': 'go'}])
    assert [r for _, _, r in res.calls] == [
        f"error: the schema of bomb cannot be checked: the pattern '{COMPILE_BOMB}' of parameter s needs more than "
        f'{COMPILE_MB} MiB to compile; the call was not made', 'plain ran', 'counted ran']
    assert (res.reason, res.answer) == ('answer', 'done')

def test_a_pattern_whose_flags_clash_is_not_a_crash(caplog):
    """A server's pattern `(?aL)` (two encodings) or `(?V0)(?V1)`: `regex` raises ValueError or KeyError, not its own
    error. The tool is built, its schema read as 'not a JSON schema' with a warning, as for any pattern `regex` refuses.
    The control: `regex.compile` itself raises those."""
    import regex
    for pattern, kind in [('(?aL)a', ValueError), ('(?V0)(?V1)a', KeyError)]:
        assert _pattern_tool('flags', pattern).call({'s': 'b'}) == 'flags ran'
        assert "is not a 'regex'" in caplog.records[-1].getMessage()
        with pytest.raises(kind): regex.compile(pattern)   # the control

def test_the_compile_budget_is_for_all_the_patterns_of_a_schema():
    """16 parameters whose patterns take about 5 MB each once compiled (`a{20000}`, 20,000 copies): together well past
    `COMPILE_MB`, so the tool is refused within `COMPILE_S` (plus slack), naming the first parameter past it. Near its
    memory cap `regex`'s C code can spin rather than fail, and then the time budget ends it. The control: one of them
    alone is compiled and checked."""
    many = {'type': 'object', 'properties': {f'p{i}': {'type': 'string', 'pattern': f'^a{{20000}}{i}$'} for i in range(16)}}
    t0 = time.monotonic()
    refused = Tool.from_spec(dict(name='many', call=lambda args: 'ran', parameters=many)).call({})
    assert time.monotonic() - t0 < COMPILE_S + 1.5, refused
    assert re.fullmatch(r"error: the schema of many cannot be checked: the pattern '\^a\{20000\}(\d+)\$' of parameter "
                        rf'p\1 (needs more than {COMPILE_MB} MiB to compile|did not compile within {COMPILE_S:.2g} s); '
                        'the call was not made', refused), refused
    one = {'type': 'object', 'properties': {'p0': many['properties']['p0']}}
    tool = Tool.from_spec(dict(name='one', call=lambda args: 'ran', parameters=one))
    assert tool.call({'p0': 'a' * 20000 + '0'}) == 'ran'   # the control
    assert tool.call({'p0': 'a0'}).startswith("error: invalid arguments for one: p0: 'a0' does not match")

ZIP_CODES = r'''
import json, sys
from apex3.agent.tools import Tool
def zip_tool(name):
    return Tool.from_spec(dict(name=name, call=lambda args: 'ran', parameters={
        'type': 'object', 'properties': {'z': {'type': 'string', 'pattern': r'^\d{5}$'}}}))
made = zip_tool('zip')
calls = [made.call({'z': '12345'}), made.call({'z': '1234'})]
sys.path.remove(sys.argv[1])   # regex stays imported here; a child given this path cannot import it
calls += [zip_tool('zip2').call({'z': '12345'}), zip_tool('zip3').call({'z': '12345'})]
print(json.dumps(calls))
'''

def _venv_without_regex(tmp_path):
    """(a venv's python without `regex`, an environment whose PYTHONPATH is this repository and the folder this
    process's `regex` comes from), the setting where `python -I` cannot see what the parent imports."""
    import regex, sysconfig
    subprocess.run([sys.executable, '-m', 'venv', '--without-pip', str(tmp_path / 'venv')], check=True)
    site = str(Path(regex.__file__).parents[1])
    folders = dict.fromkeys([str(Path(__file__).parents[1]), site, sysconfig.get_paths()['purelib']])
    return str(tmp_path / 'venv' / 'bin' / 'python'), {**os.environ, 'PYTHONPATH': os.pathsep.join(folders)}, site

def test_the_compile_child_imports_the_regex_this_process_imports(tmp_path):
    """A venv without `regex`, run with PYTHONPATH at the site-packages that has it: a tool with the pattern `^\\d{5}$`
    is built, its calls checked (`1234` refused) and made (`12345` runs). Once this process's `sys.path` no longer
    reaches `regex`, the tools built then are refused in one line that names the missing module, not the pattern, and
    the cause is logged once for both. The control: the child's command as it was, `python -I` importing `regex` with
    no path given, fails in this setting, while the venv's python alone imports it."""
    python, env, site = _venv_without_regex(tmp_path)
    p = subprocess.run([python, '-c', ZIP_CODES, site], capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 0, p.stderr
    not_started = ("the schema of {} cannot be checked: the process that compiles the patterns could not start "
                   "(ModuleNotFoundError: No module named 'regex'); the call was not made")
    assert json.loads(p.stdout) == ['ran', r"error: invalid arguments for zip: z: '1234' does not match '^\\d{5}$'",
                                    'error: ' + not_started.format('zip2'), 'error: ' + not_started.format('zip3')]
    assert p.stderr.count("No module named 'regex'") == 1, p.stderr   # said once, for both tools
    unfixed = subprocess.run([python, '-I', '-c', 'import json, resource, sys, regex'], capture_output=True,
                             text=True, env=env, timeout=60)
    assert unfixed.stderr.strip().endswith("ModuleNotFoundError: No module named 'regex'"), unfixed.stderr   # control
    assert subprocess.run([python, '-c', 'import regex'], env=env, timeout=60).returncode == 0

@pytest.mark.parametrize('child, why', [
    ('missing', r"could not start \(\[Errno 2\] No such file or directory: '.*/python'\)"),
    ('#!/bin/sh\nexec sleep 30\n', r'did not start within 0\.5 s')], ids=['missing', 'hangs'])
def test_a_compile_child_that_does_not_start_is_named_not_the_pattern(tmp_path, monkeypatch, caplog, child, why):
    """An interpreter that is not there, or one that never gets as far as compiling: the tool's calls are refused in
    one line naming that cause, within the tool's timeout (plus slack), and it is logged once for two tools. The
    control: with this interpreter the same tool is checked and made."""
    exe = tmp_path / 'python'
    if child != 'missing': exe.write_text(child); exe.chmod(0o755)
    tool = lambda: _pattern_tool('zip', r'^\d{5}$', timeout=0.5)
    assert tool().call({'s': '12345'}) == 'zip ran'   # the control
    monkeypatch.setattr(sys, 'executable', str(exe))
    t0 = time.monotonic()
    refusals = [tool().call({'s': '12345'}) for _ in range(2)]
    assert time.monotonic() - t0 < 2 * 0.5 + 1.5, refusals
    for refused in refusals:
        assert re.fullmatch(f'error: the schema of zip cannot be checked: the process that compiles the patterns {why}; '
                            'the call was not made', refused), refused
    assert len([r for r in caplog.records if r.levelname == 'WARNING']) == 1, caplog.records

APEX3 = [sys.executable, '-c', 'import sys; from apex3.cli import main; sys.exit(main())']
QUIET_SDK = 'import logging, apex3.agent.mcp; logging.getLogger("mcp.client.stdio").filters.clear()'

def apex3(*argv, before=''):
    "The CLI in a child process, as a user runs it; `before` runs first in that process (the controls' changes)."
    cmd = APEX3 if not before else [sys.executable, '-c', before + '; ' + APEX3[2]]
    return subprocess.run([*cmd, *argv], capture_output=True, text=True, timeout=120, cwd=Path(__file__).parents[1])

@pytest.mark.parametrize('mode, sent', [('garbage', "'this is not JSON-RPC {{{'"),
                                        ('deep', """'{"jsonrpc": "2.0", "id": 0, "result": [[[[[""")])
def test_a_line_that_is_not_json_rpc_is_named_in_one_line(mode, sent):
    "What the server sent, its first bytes, in the one error line; the control: the SDK's own log is a traceback."
    server = ' '.join(SERVER + ['--mode', mode])
    p = apex3('agent', 'tools', '--mcp', server, '--timeout', '2')
    assert p.returncode == 2 and len(p.stderr.splitlines()) == 1 and 'Traceback' not in p.stderr, p.stderr
    assert p.stderr.startswith('apex3 agent tools: error: listing MCP tools: no answer within 2 s; it sent a line '
                               f'that is not JSON-RPC, skipped: {sent}'), p.stderr
    raw = apex3('agent', 'tools', '--mcp', server, '--timeout', '2', before=QUIET_SDK)   # without our log filter
    assert 'Traceback' in raw.stderr and 'Failed to parse JSONRPC message' in raw.stderr, raw.stderr

def test_a_stray_log_line_is_skipped_and_the_answer_still_used():
    "A server that logs on stdout before it serves works, with one warning; the control: it did send that line."
    p = apex3('agent', 'tools', '--mcp', ' '.join(SERVER + ['--mode', 'chatty']))
    assert p.returncode == 0 and 'add' in [t['name'] for t in json.loads(p.stdout)], p.stderr
    assert p.stderr == "warning: MCP server: it sent a line that is not JSON-RPC, skipped: 'Starting apex3-test-server...'\n"
    bare = subprocess.run(SERVER + ['--mode', 'chatty'], input='', capture_output=True, text=True, timeout=60)
    assert bare.stdout.splitlines()[0] == 'Starting apex3-test-server...'

def _seconds_to_fail(timeout):
    t0 = time.monotonic()
    with pytest.raises(MCPToolError, match=f'no answer within {timeout:g} s'):
        list_tools(SERVER + ['--mode', 'silent'], timeout=timeout)
    return time.monotonic() - t0

def test_a_hung_server_costs_the_deadline_not_the_sdks_shutdown_too(monkeypatch):
    """Killed at the deadline; the control: left to the SDK's shutdown, it waits two seconds for the server to exit
    on its own before it terminates it (a floor, so the control cannot pass by load)."""
    assert _seconds_to_fail(2) < 2 + 1.8
    monkeypatch.setattr(mcp_mod, '_kill_at_deadline', lambda path: False)
    assert _seconds_to_fail(2) >= 2 + 2

def test_agent_call_and_agent_tools_agree_on_a_silent_server():
    "Both: status 2 and apex3's usual error line; the control: a tool that ran and failed is status 1."
    server = ' '.join(SERVER + ['--mode', 'silent'])
    call = apex3('agent', 'call', '--mcp', server, '--timeout', '1', 'add', '{"a": 1, "b": 2}')
    tools = apex3('agent', 'tools', '--mcp', server, '--timeout', '1')
    assert (call.returncode, call.stderr) == (2, 'apex3 agent call: error: MCP tool add: no answer within 1 s\n')
    assert (tools.returncode, tools.stderr) == (2, 'apex3 agent tools: error: listing MCP tools: no answer within 1 s\n')
    failed = apex3('agent', 'call', '--mcp', ' '.join(SERVER), 'fail', '{"message": "no"}')
    assert (failed.returncode, failed.stderr) == (1, 'apex3 agent call: error: MCP tool fail failed: '
                                                     'Error executing tool fail: no\n')
