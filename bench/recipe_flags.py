"""The recipe flags of issue 54, named and defaulted as dptrain names them: one table that the
PyTorch peer (bench/recipe_peer.py) parses and bench/time_to_accuracy.py hands on, the same
words to both programs. Their meaning is dptrain's (docs/flags.md).
Not here: torch (this module is imported where torch is not needed), the training itself.
"""

# (flag, type, default, help); type bool is a switch. Every default is "off", the book's run.
RECIPE_FLAGS = (
    ("--momentum", float, 0.0, "SGD momentum"),
    ("--nesterov", bool, False, "Nesterov momentum"),
    ("--weight-decay", float, 0.0, "coupled L2 weight decay, as torch.optim.SGD adds it"),
    ("--weight-decay-skip-norm-bias", bool, False,
     "no decay for BatchNorm weights and biases, nor for any bias"),
    ("--lr-schedule", str, "constant", "constant, step, cosine or onecycle, applied per step"),
    ("--warmup-epochs", float, 0.0, "linear warm-up epochs (may be fractional)"),
    ("--lr-step-epochs", int, 0, "epochs between the step schedule's decays"),
    ("--lr-step-gamma", float, 0.1, "the step schedule's factor"),
    ("--label-smoothing", float, 0.0, "label smoothing of the training loss"),
    ("--augment", str, "none", "none or crop-flip"),
    ("--crop-padding", int, 2, "zero padding around each image before the random crop"),
    ("--clip-grad-norm", float, 0.0, "clip the gradient's total norm to this (0: off)"),
    ("--ema", float, 0.0, "decay of the weights' moving average, evaluated (0: off)"),
    ("--val-split", int, 0, "training images held out as a validation set"),
)

SCHEDULES = ("constant", "step", "cosine", "onecycle")
AUGMENTS = ("none", "crop-flip")


def dest(flag):
    return flag[2:].replace("-", "_")


def add_recipe_flags(parser):
    """Adds the table's flags to an argparse parser, with dptrain's defaults."""
    group = parser.add_argument_group("recipe (issue 54; dptrain's names and defaults)")
    for flag, kind, default, text in RECIPE_FLAGS:
        if kind is bool:
            group.add_argument(flag, action="store_true", help=text)
        else:
            choices = SCHEDULES if flag == "--lr-schedule" else \
                AUGMENTS if flag == "--augment" else None
            group.add_argument(flag, type=kind, default=default, choices=choices,
                               help=f"{text} (default: {default})")


def recipe_argv(args):
    """The flags of `args` that differ from their defaults, as a command line: a run with every
    flag at its default passes none, so that a binary without them still runs it."""
    argv = []
    for flag, kind, default, _ in RECIPE_FLAGS:
        value = getattr(args, dest(flag))
        if value == default:
            continue
        argv += [flag] if kind is bool else [flag, str(value)]
    return argv
