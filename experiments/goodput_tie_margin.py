"""Any `specdecode` command with `goodput`'s `tie_margin` set: how wide a cap a drafter that stops when unsure gets.

    python -m experiments.goodput_tie_margin TIE bench long-context --target qwen2.5-coder-1.5b-instruct \\
        --arithmetic fast --contexts 256 --batches 1 --max-tokens 64 --repeats 3 --texts 3 \\
        --arms none,fixed:3,fixed:4,goodput --prompts code --split dev --output OUT.json

Where the drafter stops when unsure (the pair's arm: below 0.7), `goodput` takes the widest K whose predicted rate is
within `tie_margin` of the best (`GoodputController._with_hysteresis`); the default is 0.01. On the pair at one row
of 256 tokens the choice between K = 3 and K = 4 turned on ~0.2 ms of a ~36 ms step, below the cost model's error.
Every controller the command makes gets TIE. Use dev text: it is for working out what the margin should be.
"""

from __future__ import annotations

import sys

from specdecode.cli import main
from specdecode.control import goodput as g

_init = g.GoodputController.__init__


def with_tie(tie: float):
    def init(self: g.GoodputController, *args, **kwargs) -> None:
        _init(self, *args, **kwargs)
        self.tie_margin = tie

    return init


if __name__ == "__main__":
    g.GoodputController.__init__ = with_tie(float(sys.argv[1]))
    sys.exit(main(sys.argv[2:]))
