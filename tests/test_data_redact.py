"Redaction replaces whole secrets: a generated suite, answer key (two seeds, 240 cases each), and the issue's cases."
import random
from collections import Counter
import pytest
from apex3.data.redact import Redact, secret_cases, whole_replaced, suite_table
from apex3.data.scrub import scrub

@pytest.mark.parametrize('seed', [1, 2])
def test_generated_suite_recall(seed):
    cases = secret_cases(random.Random(seed), 240)
    r = Redact()
    outs = [r.redact(c['prefix'] + c['secret'] + c['suffix'], Counter()) for c in cases]
    missed = [(c['kind'], o) for c, o in zip(cases, outs) if not whole_replaced(c, o)]
    assert not missed, missed[:3]
    t = suite_table(cases, outs)
    assert len({k for k, _ in t.index} - {'all'}) == 10  # every kind is in the suite

def test_whole_replaced_is_strict():
    c = dict(prefix='x = "', secret='ghp_' + 'a' * 36, suffix='"')
    assert not whole_replaced(c, 'x = "<SECRET_GITHUB_TOKEN>' + 'a' * 4 + '"')  # a kept tail fails
    assert not whole_replaced(c, 'x = "' + c['secret'] + '"')
    assert whole_replaced(c, 'x = "<SECRET_GITHUB_TOKEN>"')

def test_issue_cases():
    body = 'Kx7' * 12
    assert scrub(f'token ghp_{body} end') == 'token <SECRET_GITHUB_TOKEN> end'          # (a) not just the prefix
    aws = 'wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY'
    assert aws not in scrub(f'the secret is {aws}.') and 'K7MDENG' not in scrub(f'aws_secret_access_key = {aws}')  # (b)
    assert scrub('write to bob.smith@example.io__.') == 'write to <EMAIL>__.'              # (c)
    assert scrub('password = "hunter22"') == 'password = "<SECRET_CREDENTIAL>"'            # (d)
    assert scrub("api_key: 'f3a9c2e18b7d4a6c'") == "api_key: '<SECRET_CREDENTIAL>'"
    sha = 'sha = "3f786850e387550fdab836ed7e6dc881de23001b"'
    for keep in ('token_type = "word"', 'password = getpass.getpass()', sha):
        assert scrub(keep) == keep
