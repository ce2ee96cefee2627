"`apex3 agent` as a user meets it: a real process, bad input is one stderr line and status 2, a trace replays."
import json, os, subprocess, sys
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
