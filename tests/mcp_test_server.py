"An MCP server for the MCP client's tests, built on the SDK's own MCPServer: stdio by default, HTTP with --port."
import argparse, os, sys, time
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer('apex3-test-server')

@server.tool()
def add(a: int, b: int) -> int:
    "Add two integers."
    return a + b

@server.tool()
def shout(text: str) -> str:
    "Upper-case a string."
    return text.upper()

@server.tool()
def fail(message: str) -> str:
    "Fail with `message` (a ToolError: the one exception whose text MCPServer passes on to the client)."
    raise ToolError(message)

@server.tool()
def crash() -> str:
    "End the server process in the middle of a call."
    os._exit(3)

@server.tool()
def hang(seconds: float = 3600) -> str:
    "Sleep far longer than any client should wait."
    time.sleep(seconds)
    return 'woke up'

if __name__ == '__main__':
    p = argparse.ArgumentParser()
    p.add_argument('--port', type=int)
    p.add_argument('--mode', choices=['ok', 'garbage', 'deep', 'chatty', 'silent', 'exit'], default='ok')
    a = p.parse_args()
    if a.mode == 'exit':  # fails at start, saying why on stderr, as a server missing its configuration does
        print('reading settings from the environment', file=sys.stderr)
        print('fatal: TEST_SERVER_KEY is not set', file=sys.stderr)
        sys.exit(3)
    if a.mode == 'garbage':  # a process that answers anything with noise on stdout
        for line in sys.stdin: print('this is not JSON-RPC {{{', flush=True)
    elif a.mode == 'deep':  # answers the handshake with JSON nested past any parser's depth
        for line in sys.stdin: print('{"jsonrpc": "2.0", "id": 0, "result": ' + '[' * 100_000 + ']' * 100_000 + '}', flush=True)
    elif a.mode == 'chatty':  # logs on stdout before it serves, as many servers do
        print('Starting apex3-test-server...', flush=True)
        server.run()
    elif a.mode == 'silent': time.sleep(3600)  # starts, never answers the handshake
    elif a.port: server.run(transport='streamable-http', host='127.0.0.1', port=a.port)
    else: server.run()
