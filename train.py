"""Train a model: ``python train.py [configs/X.yaml] [section.key=value ...]``.

With no arguments it runs configs/default.yaml: a small GPT trained on English text shipped with
Python, on whatever devices are present, ending with a generated sample.
"""

import sys
import warnings
from pathlib import Path

from jaxformer.train.lifecycle import Interrupted
from jaxformer.train.run import main

_format_warning = warnings.formatwarning


def one_line_notes(message, category, filename, lineno, line=None) -> str:
    """jaxformer's own warnings (a config's overrides not applied, a shortened warmup) are notes to the person
    running this: one line, without the source line that raised them."""
    if "jaxformer" in Path(filename).parts:
        return f"train.py: warning: {message}\n"
    return _format_warning(message, category, filename, lineno, line)


if __name__ == "__main__":
    warnings.formatwarning = one_line_notes
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
