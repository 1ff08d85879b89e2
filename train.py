"""Train a model: ``python train.py [configs/X.yaml] [section.key=value ...]``.

With no arguments it runs configs/default.yaml: a small GPT trained on English text shipped with
Python, on whatever devices are present, ending with a generated sample.
"""

import sys

from jaxformer.train.lifecycle import Interrupted
from jaxformer.train.run import main

if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except Interrupted as stop:  # Ctrl-C or SIGTERM: the step it reached is saved
        print(f"train.py: {stop}", file=sys.stderr)
        sys.exit(stop.exit_code)
    except ValueError as err:  # configuration errors: say what and where, no traceback
        print(f"train.py: error: {err}", file=sys.stderr)
        sys.exit(2)
    except FloatingPointError as err:  # a non-finite loss under train.on_nan=stop
        print(f"train.py: stopped: {err}", file=sys.stderr)
        sys.exit(3)
