"The `apex3 data` command: bad input is one UsageError line; one stage runs over a folder of shards."
import json, pytest
from apex3.usage import UsageError
from apex3.data.core import Document, write_docs, read_docs, list_shards
from apex3.data.pipeline import data_main

def test_usage_errors(tmp_path):
    with pytest.raises(UsageError, match='no such config'): data_main(['run', str(tmp_path/'missing.toml')])
    (tmp_path/'bad.toml').write_text('[pipeline\n')
    with pytest.raises(UsageError): data_main(['run', str(tmp_path/'bad.toml')])
    write_docs(tmp_path/'in'/'s.jsonl.zst', [Document('a', 'x')])
    with pytest.raises(UsageError, match="unknown stage 'frobnicate'"): data_main(['frobnicate', str(tmp_path/'in'), 'out'])
    # an unknown stage is named before its arguments are looked at
    with pytest.raises(UsageError, match="unknown stage 'frobnicate'"): data_main(['frobnicate', 'a', 'b'])
    with pytest.raises(UsageError, match='no \\*.jsonl.zst shards'): data_main(['redact', str(tmp_path/'nothing'), str(tmp_path/'out')])

def test_one_stage_redact(tmp_path, capsys):
    write_docs(tmp_path/'in'/'s0.jsonl.zst', [Document('a', 'mail bob.smith@example.org from 8.8.8.8'), Document('b', 'nothing here')])
    assert data_main(['redact', str(tmp_path/'in'), str(tmp_path/'out'), '--set', 'ips=false']) == 0
    docs = [d for s in list_shards(tmp_path/'out') for d in read_docs(s)]
    assert [d.text for d in docs] == ['mail <EMAIL> from 8.8.8.8', 'nothing here']
    counts = json.loads(capsys.readouterr().out)
    assert counts['redact/redacted:EMAIL'] == 1 and counts['docs_out'] == 2

def test_one_stage_dedup(tmp_path):
    text = ' '.join(f'word{i}' for i in range(200))
    write_docs(tmp_path/'in'/'s0.jsonl.zst', [Document('a', text), Document('b', 'unrelated ' * 10)])
    write_docs(tmp_path/'in'/'s1.jsonl.zst', [Document('c', text.upper())])
    assert data_main(['dedup', str(tmp_path/'in'), str(tmp_path/'out')]) == 0
    assert sorted(d.id for s in list_shards(tmp_path/'out') for d in read_docs(s)) == ['a', 'b']
