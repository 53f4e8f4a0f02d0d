"""The compile pipeline as users see it: every stage recorded and timed, dumps through Python,
registered passes a jit can add, and bad names refused."""

import logging
import subprocess
import sys

import pytest
import torch

import thunder_rs
from thunder_rs.errors import ThunderValueError


def _fn(x, y):
    return (x * y).sin() + (x * y).sin()


def _args(requires_grad=False):
    return torch.randn(3, 4, requires_grad=requires_grad), torch.randn(3, 4)


def test_every_stage_is_recorded_in_order():
    jfn = thunder_rs.jit(_fn)
    x, y = _args(requires_grad=True)
    torch.testing.assert_close(jfn(x, y), _fn(x, y))
    labels = [t.label for t in thunder_rs.last_traces(jfn)]
    assert labels == ["acquired", "dce", "cse", "vjp", "split", "dce", "cse", "views", "claim", "lifetimes"]
    backward = [t.label for t in thunder_rs.last_backward_traces(jfn)]
    assert backward == ["dce", "materialized", "cse", "views", "claim", "lifetimes"]  # split is recorded once, above
    stats = thunder_rs.compile_stats(jfn)
    assert "pass:lifetimes" in stats.stage_s and "backward:claim" in stats.stage_s
    dce_s = [t.seconds for t in thunder_rs.last_traces(jfn) if t.label == "dce"]
    assert stats.stage_s["pass:dce"] == pytest.approx(sum(dce_s))  # both dce stages, summed


def test_dumps_go_through_python(monkeypatch, capsys):
    monkeypatch.setenv("THUNDER_RS_DUMP", "cse,lifetimes")
    jfn = thunder_rs.jit(_fn)
    jfn(*_args())
    err = capsys.readouterr().err
    assert "after cse" in err and "after lifetimes" in err and "after dce" not in err
    assert err.count("prims.sin") == 1  # CSE merged the two sines


def test_dumps_reach_a_configured_logger(monkeypatch, caplog):
    monkeypatch.setenv("THUNDER_RS_DUMP", "all")
    with caplog.at_level(logging.INFO, logger="thunder_rs.dump"):
        thunder_rs.jit(_fn)(*_args())
    stages = [line.split("after ")[1].split(" ")[0] for line in caplog.messages]
    assert stages == ["acquired", "dce", "cse", "views", "claim", "lifetimes"]


def test_unknown_dump_name_is_an_error_listing_the_stages(monkeypatch):
    monkeypatch.setenv("THUNDER_RS_DUMP", "cse,nope")
    with pytest.raises(ThunderValueError, match=r'THUNDER_RS_DUMP.*"nope".*claim.*lifetimes'):
        thunder_rs.jit(_fn)(*_args())
    monkeypatch.delenv("THUNDER_RS_DUMP")
    args = _args()
    torch.testing.assert_close(thunder_rs.jit(_fn)(*args), _fn(*args))


def test_a_jit_runs_registered_passes_after_cse():
    assert {"dce", "cse", "vjp"} <= set(thunder_rs.registered_passes())
    jfn = thunder_rs.jit(_fn, passes=["dce"])
    x, y = _args()
    torch.testing.assert_close(jfn(x, y), _fn(x, y))
    assert [t.label for t in thunder_rs.last_traces(jfn)][:4] == ["acquired", "dce", "cse", "dce"]


@pytest.mark.parametrize("passes", [["no_such_pass"], "dce", [3]])
def test_bad_pass_names_are_refused(passes):
    with pytest.raises(ThunderValueError, match="argument passes"):
        thunder_rs.jit(_fn, passes=passes)


def test_verify_on_request_in_release_builds():
    code = "import thunder_rs, torch; f = thunder_rs.jit(lambda x: x.exp() * 2); print(repr(f(torch.ones(2)).tolist()))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"THUNDER_RS_VERIFY": "1", "THUNDER_RS_DUMP": "lifetimes"},
    )
    assert out.stdout.strip() == repr((torch.ones(2).exp() * 2).tolist())
    assert "after lifetimes" in out.stderr
