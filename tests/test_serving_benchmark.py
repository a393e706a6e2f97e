"""benchmarks/serving.py: a tiny run on the course's model prints its three tables, checks every
output against generating it alone, and exits 0."""

import torch

from benchmarks import serving

# --threads 1 keeps the run quick when other jobs share the cores (see the script's docstring).


def test_a_tiny_run_prints_the_tables_and_passes_its_check(capsys):
    threads = torch.get_num_threads()
    status = serving.main(["--model", "tiny", "--requests", "6", "--max-new", "6", "--max-batch", "3",
                           "--block-size", "8", "--threads", "1"])
    out = capsys.readouterr().out
    assert status == 0, out
    for heading in ("1. static vs continuous batching", "2. prefix caching off vs on", "3. preemption"):
        assert heading in out
    for row in ("static", "continuous", "continuous + prefix cache", "no cache, ", "cache, "):
        assert f"\n{row}" in out
    assert "continuous / static: throughput" in out and "regime: overhead-bound" in out
    assert "equals generating it alone: yes, in all 5 runs" in out
    assert torch.get_num_threads() == threads  # main gives the process its thread count back


def test_a_differing_output_makes_the_check_fail(monkeypatch, capsys):
    real = serving.alone

    def wrong(setup, requests):  # pretend one request's reference differs
        expected = real(setup, requests)
        expected["r0"] = expected["r0"][:-1] + [(expected["r0"][-1] + 1) % 256]
        return expected

    monkeypatch.setattr(serving, "alone", wrong)
    status = serving.main(["--model", "tiny", "--requests", "3", "--max-new", "4", "--max-batch", "2", "--threads", "1"])
    out = capsys.readouterr().out
    assert status == 1
    assert "NO: {'static': ['r0']" in out and "DIFFER" in out
