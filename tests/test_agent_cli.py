"`apex3 agent` as a user meets it: a real process, bad input is one stderr line and status 2, a trace replays."
import contextlib, json, os, subprocess, sys, threading, time
from pathlib import Path

ROOT = Path(__file__).parents[1]

def agent(*args):
    env = {**os.environ, 'PYTHONPATH': str(ROOT)}
    return subprocess.run([sys.executable, '-c', 'import sys; from apex3.cli import main; sys.exit(main())', 'agent', *map(str, args)], capture_output=True, text=True, env=env)

def test_bad_input_is_one_line(tmp_path):
    (tmp_path / 'bad.jsonl').write_text('not json\n')
    for args in (['nope'], ['replay'], ['replay', tmp_path / 'missing.jsonl'], ['replay', tmp_path / 'bad.jsonl'],
                 ['demo', '--steps', 'soon'], ['demo', '--steps', '0']):
        p = agent(*args)
        assert p.returncode == 2, (args, p.stderr)
        assert len(p.stderr.strip().splitlines()) == 1 and 'Traceback' not in p.stderr, (args, p.stderr)

def test_what_a_hostile_hunt_found_is_one_line(tmp_path):
    """Input that gave a traceback (exit 1), each now one line and status 2: bytes that are not UTF-8 on the command
    line and on stdin, a URL Python cannot parse, a key no HTTP header carries, an unquoted MCP command, arguments
    nested past Python's recursion or holding an integer past its digits, a memory limit past a C long."""
    url = ['--model-url', 'http://127.0.0.1:9/v1', '--model', 'm']
    deep = '[' * 20000 + ']' * 20000
    env = {**os.environ, 'PYTHONPATH': str(ROOT), 'PYTHONUTF8': '1'}   # command-line bytes kept as such
    cases = [(['run', *url, '--prompt', b'\xff'], 'not valid UTF-8'),
             (['run', '--model-url', 'http://[::1/v1', '--model', 'm', '--prompt', 'hi'], 'Invalid IPv6'),
             (['run', *url, '--api-key', 'k\u00e9', '--prompt', 'hi'], 'printable ASCII'),
             (['tools', '--mcp', '"unterminated'], 'quote as a shell would'),
             (['call', '--mcp', sys.executable, 'echo', deep], 'nested too deep'),
             (['call', '--mcp', sys.executable, 'echo', '{"n": %s}' % ('9' * 5000)], 'an integer of more than'),
             (['sandbox', '--memory', str(10 ** 14), '--', 'true'], '--memory')]
    for args, why in cases:
        p = subprocess.run([sys.executable, '-c', 'import sys; from apex3.cli import main; sys.exit(main())', 'agent',
                            *args], capture_output=True, env=env)
        err = p.stderr.decode(errors='replace')
        assert p.returncode == 2 and len(err.strip().splitlines()) == 1 and why in err, (args[:3], err)
    p = subprocess.run([sys.executable, '-c', 'import sys; from apex3.cli import main; sys.exit(main())', 'agent',
                        'chat', *url], input=b'hi \xff\xfe\n', capture_output=True, env=env)
    assert p.returncode == 2 and b'not valid UTF-8' in p.stderr, p.stderr[-500:]

def test_replay_of_a_real_trace(tmp_path):
    from apex3.agent.loop import ScriptedModel, run_agent
    from apex3.agent.tools import SubprocessRunner, python_tool
    m = ScriptedModel(['<tool_call>\n{"name": "python", "arguments": {"code": "print(2**10)"}}\n</tool_call><|im_end|>',
                       'It is 1024.<|im_end|>'])
    run_agent(m, [python_tool(SubprocessRunner())], [{'role': 'user', 'content': '2**10?'}], trace=tmp_path / 't.jsonl')
    p = agent('replay', tmp_path / 't.jsonl')
    assert p.returncode == 0 and p.stdout.strip().endswith('replayed 2 turns: identical'), p.stdout + p.stderr
    recs = [json.loads(l) for l in (tmp_path / 't.jsonl').read_text().splitlines()]
    assert "'1024\\n'" in p.stdout and recs[1]['results'] == ['1024\n']

def test_unisolated_runner_keeps_the_callers_environment_out(monkeypatch):
    "The fallback runner (no sandbox backend): a key in the caller's environment is not in the code's, nor a child's."
    from apex3.agent.tools import SubprocessRunner, python_tool
    monkeypatch.setenv('APEX3_CLI_BAIT', 'sk-planted-6767')
    code = ("import os, subprocess\n"
            "print(os.environ.get('APEX3_CLI_BAIT'), subprocess.getoutput('env').count('sk-planted'))")
    assert python_tool(SubprocessRunner(), timeout=5).fn(dict(code=code)) == 'None 0\n'
    leaky = SubprocessRunner(env=dict(os.environ))   # the control: with the host environment passed, the code sees it
    assert python_tool(leaky, timeout=5).fn(dict(code=code)) == 'sk-planted-6767 1\n'

def test_a_trace_that_is_not_one_is_one_line(tmp_path):
    """Traces whose records have the right containers but the wrong things in them (a turn without its number, pieces
    that are not text, a message that is not an object, a system message last), each one line and status 2; the
    control: the same trace made right is replayed."""
    start = {'kind': 'start', 'messages': [{'role': 'user', 'content': 'hi'}], 'tools': [], 'max_turns': 2,
             'max_tokens': 50, 'max_output': 100}
    turn = {'kind': 'turn', 'turn': 0, 'prompt': 'p', 'pieces': ['hello', '<|im_end|>'], 'results': []}
    end = {'kind': 'end', 'reason': 'answer', 'answer': 'hello'}
    bad = [(start, {k: v for k, v in turn.items() if k != 'turn'}), (start, {**turn, 'pieces': [1, 2]}),
           ({**start, 'messages': ['hi']}, turn),
           ({**start, 'messages': [{'role': 'user', 'content': 'hi'}, {'role': 'system', 'content': 'late'}]}, turn)]
    for k, (s, t) in enumerate(bad):
        (tmp_path / f'{k}.jsonl').write_text('\n'.join(json.dumps(r) for r in (s, t, end)) + '\n')
        p = agent('replay', tmp_path / f'{k}.jsonl')
        assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and 'Traceback' not in p.stderr, p.stderr
    (tmp_path / 'good.jsonl').write_text('\n'.join(json.dumps(r) for r in (start, turn, end)) + '\n')
    p = agent('replay', tmp_path / 'good.jsonl')   # replayed (its recorded prompt differs from the real one: status 1)
    assert p.returncode == 1 and 'replayed 1 turns: differs at turn 0' in p.stdout, (p.stdout, p.stderr)

DEEP_CHUNK = b'data: {"choices":' + b'[' * 100_000 + b']' * 100_000 + b'}\n\ndata: [DONE]\n\n'

def _read_request(conn):
    "All of one HTTP request (an unread byte left at close would reset the connection under the reply)."
    data = b''
    while b'\r\n\r\n' not in data: data += conn.recv(65536)
    head, body = data.split(b'\r\n\r\n', 1)
    length = int(next(l.split(b':')[1] for l in head.split(b'\r\n') if l.lower().startswith(b'content-length')))
    while len(body) < length: body += conn.recv(65536)

def _endpoint(reply):
    "A model endpoint on 127.0.0.1 in a thread: `reply` bytes after the headers, or None for one that never answers."
    import socket, threading
    srv = socket.socket()
    srv.bind(('127.0.0.1', 0))
    srv.listen(8)
    def serve():
        while True:
            try: conn, _ = srv.accept()
            except OSError: return
            if reply is not None:
                with contextlib.suppress(OSError):   # a client that has read enough closes the connection early
                    _read_request(conn)
                    conn.sendall(b'HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\n' + reply)
                conn.close()
    threading.Thread(target=serve, daemon=True).start()
    return srv, f'http://127.0.0.1:{srv.getsockname()[1]}/v1'

def test_a_chunk_nested_too_deep_is_one_line():
    "The control: the chunk really is past the JSON parser's depth (the reference parser raises RecursionError)."
    srv, url = _endpoint(DEEP_CHUNK)
    with srv: p = agent('run', '--model-url', url, '--model', 'm', '--prompt', 'hi')
    want = f'apex3 agent run: error: {url}/chat/completions: a streamed chunk is JSON nested too deep\n'
    assert (p.returncode, p.stderr) == (2, want)
    import pytest
    with pytest.raises(RecursionError): json.loads(DEEP_CHUNK.split(b'\n')[0][len(b'data: '):])

def _sse(delta) -> bytes:
    return b'data: ' + json.dumps({'choices': [{'index': 0, 'delta': delta}]}).encode() + b'\n\n'

def _long_call(fragments) -> bytes:
    "A streamed reply of one python call whose code comes in `fragments` chunks of 1 KB."
    args = ['{"code": "', *['x' * 1024] * fragments, '"}']
    call = [{'index': 0, 'id': 'c', 'type': 'function', 'function': {'name': 'python'}}]
    return _sse({'tool_calls': call}) + b''.join(_sse({'tool_calls': [{'index': 0, 'function': {'arguments': a}}]})
                                                  for a in args) + b'data: [DONE]\n\n'

def _run_on(reply, max_tokens):
    "(last stdout line, seconds) of `apex3 agent run` on an endpoint that streams `reply`."
    srv, url = _endpoint(reply)
    t0 = time.monotonic()
    with srv: p = agent('run', '--model-url', url, '--model', 'm', '--prompt', 'hi', '--max-turns', '1',
                        '--max-tokens', max_tokens)
    return p.stdout.strip().splitlines()[-1], time.monotonic() - t0

def test_max_tokens_bounds_a_calls_streamed_arguments():
    """Each fragment of a call's arguments takes a piece of --max-tokens, as a token of text does: 16,000 fragments of
    1 KB are cut after 200, the turn ends on the budget with no call. The control: a call within the budget is made."""
    line, _ = _run_on(_long_call(16_000), 200)
    assert line == '[tokens: 1 turns, 0 calls, 200 pieces]'
    line, _ = _run_on(_long_call(100), 200)   # 103 fragments (the name, 102 of arguments), the call, the end
    assert line == '[turns: 1 turns, 1 calls, 105 pieces]'

def test_a_calls_arguments_are_gathered_in_linear_time():
    """32 MB of arguments in 1 KB fragments, within the budget, take about 8x as long as 4 MB (a string grown by `+=`
    copies what it holds at each fragment: 64x)."""
    from apex3.agent.remote import RemoteModel
    def seconds(fragments):
        srv, url = _endpoint(_long_call(fragments))
        pieces, t0 = [], time.monotonic()
        with srv:   # in a thread: a quadratic gathering would take minutes, which the test does not wait for
            chat = lambda: pieces.extend(RemoteModel(url, 'm').chat([{'role': 'user', 'content': 'hi'}], [], 10**6))
            (t := threading.Thread(target=chat, daemon=True)).start()
            t.join(60)
        assert len(pieces) > 1 and len(pieces[-2]) > fragments * 1024, 'the call did not come whole within 60 s'
        return time.monotonic() - t0
    small, big = seconds(4_000), seconds(32_000)
    assert small < big < 20 * small, (small, big)

def test_the_timeout_flag_bounds_a_server_that_never_answers():
    "`--timeout` reaches the client: one line naming it; the seconds waited follow it (control: a longer one waits more)."
    import time
    from apex3.agent.remote import RemoteError, RemoteModel
    srv, url = _endpoint(None)
    with srv:
        p = agent('run', '--model-url', url, '--model', 'm', '--prompt', 'hi', '--timeout', '1')
        want = f'apex3 agent run: error: {url}/chat/completions: no answer within 1 s (ReadTimeout)\n'
        assert (p.returncode, p.stderr) == (2, want)
        def waited(timeout):
            t0 = time.monotonic()
            try: list(RemoteModel(url, 'm', timeout=timeout).chat([{'role': 'user', 'content': 'hi'}], [], 8))
            except RemoteError: return time.monotonic() - t0
        short, long = waited(1), waited(3)
    assert 1 <= short < 3 <= long, (short, long)

def test_replay_reads_a_trace_with_a_bound(tmp_path):
    """What is not a regular file (a device that never ends, a FIFO with no writer) and a trace past TRACE_MAX_BYTES
    are each one line, at once; the controls: a size check alone would pass /dev/zero (its size is 0), and the trace
    one byte under the bound is read (and refused for its content, not its size)."""
    from apex3.agent.loop import TRACE_MAX_BYTES
    os.mkfifo(tmp_path / 'fifo')
    with open(tmp_path / 'big.jsonl', 'wb') as f: f.truncate(TRACE_MAX_BYTES + 1)   # sparse: no disk, no time
    with open(tmp_path / 'under.jsonl', 'wb') as f: f.truncate(TRACE_MAX_BYTES - 1)
    for path, why in (('/dev/zero', 'not a regular file'), (tmp_path / 'fifo', 'not a regular file'),
                      (tmp_path / 'big.jsonl', f'larger than {TRACE_MAX_BYTES:,} bytes')):
        p = subprocess.run([sys.executable, '-c', 'import sys; from apex3.cli import main; sys.exit(main())', 'agent',
                            'replay', str(path)], capture_output=True, text=True, timeout=60,
                           env={**os.environ, 'PYTHONPATH': str(ROOT)})
        assert (p.returncode, p.stderr) == (2, f'apex3 agent replay: error: cannot read trace {path}: {why}\n'), p.stderr
    assert os.path.getsize('/dev/zero') == 0
    p = agent('replay', tmp_path / 'under.jsonl')
    assert p.returncode == 2 and 'larger than' not in p.stderr and 'under.jsonl:1: not a JSON line' in p.stderr, p.stderr
