"""`make demo` runs `eqsat.demo`: every stage prints, the compiled step matches the
interpreter, and the loss goes down."""

from __future__ import annotations

import re

from eqsat import demo


def test_the_demo_trains_and_reports_each_stage(capsys):
    assert demo.main() == 0
    out = capsys.readouterr().out
    for n in range(1, 7):
        assert f"== {n}. " in out
    assert re.search(r"@train_step .* optimized", out)  # the report row of the step
    err = float(re.search(r"max abs difference (\S+)", out).group(1))
    assert err < 1e-5
    losses = [float(v) for v in re.findall(r"loss (\d+\.\d+)", out)]
    assert len(losses) == demo.STEPS // 10 + 1 and losses[-1] < losses[0] / 100
    assert re.search(r"eqsat compiled +\d+\.\d us .*x as fast\)", out)
