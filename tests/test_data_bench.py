"The benchmark's bookkeeping (records/data_bench.py): recall on planted pairs and per-core rates, checked by hand."
import importlib.util
from pathlib import Path
import pytest

_spec = importlib.util.spec_from_file_location('data_bench', Path(__file__).parents[1]/'records'/'data_bench.py')
bench = importlib.util.module_from_spec(_spec); _spec.loader.exec_module(bench)

PAIRS = [{'original': 'a', 'copy': 'a2', 'source': 'code'}, {'original': 'b', 'copy': 'b2', 'source': 'code'},
         {'original': 'c', 'copy': 'c2', 'source': 'code'}, {'original': 'p', 'copy': 'p2', 'source': 'prose'}]

def test_recall_counts_pairs_by_hand():
    # a2 removed (caught); b and b2 both removed (caught, both); c pair untouched (missed); x is outside the pairs
    r = bench.recall(PAIRS[:3], ['a2', 'b', 'b2', 'x'])
    assert r == dict(planted_pairs=3, caught=2, both_removed=1, other_removed=1)

def test_compare_records_rates_and_recall():
    inputs = {'code': (100, 2_000_000), 'prose': (50, 500_000)}
    res = {'apex3': {'clean:prose': dict(seconds=2., cpu_seconds=1., docs_out=40, removed_ids=['q'] * 10),
                     'dedup:prose': dict(seconds=1., cpu_seconds=.5, docs_out=49, removed_ids=['p2']),
                     'dedup:code': dict(seconds=4., cpu_seconds=4., docs_out=98, removed_ids=['a2', 'b'])}}
    recs = {r['task']: r for r in bench.compare_records(inputs, res, {'near_dups': PAIRS})}
    assert recs['clean:prose']['docs_per_s_core'] == 50 and recs['clean:prose']['mb_per_s_core'] == pytest.approx(.5)
    assert recs['dedup:code']['recall'] == pytest.approx(2 / 3) and recs['dedup:prose']['recall'] == 1
    assert recs['clean+dedup:prose']['cpu_seconds'] == 1.5 and recs['clean+dedup:prose']['docs_per_s_core'] == pytest.approx(50 / 1.5)
    assert 'recall' not in recs['clean:prose']  # only dedup has recall

def test_agreement_is_jaccard_of_removed_sets():
    res = {'apex3': {'dedup:code': {'removed_ids': ['a', 'b', 'c']}}, 'datatrove': {'dedup:code': {'removed_ids': ['b', 'c', 'd']}}}
    assert bench.agreement(res) == {'dedup:code': 0.5}
