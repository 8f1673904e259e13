"""The options of the ``fgscale`` command line, shared by its subcommands: the estimator's
parameters from their table, the cluster, the device, progress bars, the synthetic cohort; and
the help formatter that shows every option's default."""

from __future__ import annotations

import argparse
import difflib
import math
import os
import re
import sys
import warnings

__all__ = ["HelpFormatter", "Parser", "add_bank_args", "add_cluster_args", "add_cohort_args",
           "add_column_args", "add_cv_args", "add_device_arg", "add_estimator_args", "add_param",
           "add_progress_arg", "add_task_arg", "add_worker_kind_arg", "as_options", "client_of", "columns_of",
           "estimator_params", "given_options",
           "one_line_warnings", "warn_unused_cluster_options",
           "parse_grid", "parse_resample", "positive", "saved_cv_unless_given",
           "saved_unless_given", "security_from", "worker_processes"]


class HelpFormatter(argparse.HelpFormatter):
    """``--help`` shows every option's default: in the help's own words when it says it (a
    None default always does: "(default: computed from the images)"), else appended; a
    flag's is "off"."""

    def _get_help_string(self, action):
        text = action.help or ""
        if ("default" in text or action.required or not action.option_strings
                or action.default in (None, argparse.SUPPRESS)):
            return text
        if action.nargs == 0 and action.const is True:  # store_true
            return f"{text} (default: off)"
        return f"{text} (default: %(default)s)"


class Parser(argparse.ArgumentParser):
    """The formatter of the top parser and of every subcommand (argparse makes subparsers of
    the top parser's class)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        # "--max-epoch" is a typo to point out, not a prefix to accept: accepted prefixes would
        # break scripts the day an option sharing them is added
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message):
        """As argparse's, but a usage of more than a few lines (a subcommand's twenty options)
        is cut to its arguments and required options, so that the error line is not buried."""
        usage = self.format_usage()
        if usage.count("\n") > 3:
            needed = [a.metavar or (a.dest.upper() if a.option_strings else a.dest)
                      for a in self._actions if not a.option_strings and a.help != argparse.SUPPRESS]
            needed += [f"{a.option_strings[0]} {a.metavar or a.dest.upper()}"
                       for a in self._actions if a.option_strings and a.required]
            usage = (f"usage: {self.prog} {' '.join(map(str, needed))} [options] "
                     f"({self.prog} --help lists them)\n")
        self.exit(2, f"{usage}{self.prog}: error: {message}\n")

    def parse_args(self, args=None, namespace=None):
        """As argparse's, but arguments that the subcommand does not know are reported by it
        (``fgscale train: error: ...``, with its usage and its closest options), not by the
        top parser, which knows none of the subcommand's options."""
        namespace, extras = self.parse_known_args(args, namespace)
        if extras:
            commands = [a.choices for a in self._actions
                        if isinstance(a, argparse._SubParsersAction)]
            command = commands[0].get(getattr(namespace, "command", None), self) if commands else self
            known = [o for a in command._actions for o in a.option_strings]
            close = {w: difflib.get_close_matches(w.split("=")[0], known, n=1, cutoff=0.7)
                     for w in extras if w.startswith("--")}
            hints = [f"{c[0]} (not {w.split('=')[0]})" for w, c in close.items() if c]
            # the top parser's option, given after the command as most tools take it
            verbose = [w for w in extras if w == "--verbose" or re.fullmatch(r"-v+", w)]
            if verbose and command is not self:
                hints.append(f"{verbose[0]} before the command (fgscale {verbose[0]} "
                             f"{namespace.command} ...)")
            command.error(f"unrecognized arguments: {' '.join(extras)}"
                          + (f"; did you mean {', '.join(hints)}?" if hints else ""))
        # a quoted '~/...' (a batch script, a config file) reaches us unexpanded: it means the
        # home folder, as for NIfTI paths, never a folder named '~' in the working directory
        for name in _PATHS & set(vars(namespace)):
            value = getattr(namespace, name)
            if isinstance(value, str):
                setattr(namespace, name, os.path.expanduser(value))
            elif isinstance(value, list):
                setattr(namespace, name, [os.path.expanduser(v) if isinstance(v, str) else v
                                          for v in value])
        if (getattr(namespace, "scheduler", "") is None
                and getattr(namespace, "scheduler_file", "") is None):
            # which a batch job sets for every Dask client, as distributed.Client() reads it
            # (read here from the environment: a small convert imports no Dask)
            namespace.scheduler = os.environ.get("DASK_SCHEDULER_ADDRESS") or None
            namespace.scheduler_origin = "$DASK_SCHEDULER_ADDRESS"  # said in its errors
        return namespace


# the options and arguments that name files or folders
_PATHS = {"store", "out", "run", "cohort", "inputs", "mask", "labels", "predictions", "npy",
          "scheduler_file", "tls_ca_file", "tls_cert", "tls_key"}


def add_progress_arg(p) -> None:
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bars (tqdm, on stderr): for log files and batch jobs")


def parse_grid(text: str):
    """``--grid``: "4mm", "2mm", "1mm", or a box of XxYxZ voxels."""
    if text in ("4mm", "2mm", "1mm"):
        return text
    parts = text.lower().split("x")
    if len(parts) == 3 and all(p.isdigit() and int(p) > 0 for p in parts):
        return tuple(int(p) for p in parts)
    raise argparse.ArgumentTypeError(f"expected 4mm, 2mm, 1mm or XxYxZ (a box of voxels), got {text!r}")


def positive(kind):
    """The type of an option that takes a positive int or float: anything else is refused by
    argparse, naming the option (a negative --block-rows or --timeout would reach zarr or the
    connection and fail there, in their words)."""
    what = "a positive integer" if kind is int else "a positive number"

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not math.isfinite(value) or value <= 0:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value

    return parse


def parse_resample(text: str):
    """``convert --resample``: a voxel size in mm, or "mask"."""
    if text == "mask":
        return text
    try:
        return positive(float)(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected a voxel size in mm (a positive number) or "
                                         f"'mask', got {text!r}") from None


def add_cohort_args(p) -> None:
    """The options of ``make-cohort``, with make_cohort's own defaults."""
    import inspect

    from fgscale.images import make_cohort

    default = {k: v.default for k, v in inspect.signature(make_cohort).parameters.items()}
    for name, kind, text in (
            ("n_samples", int, "volumes to generate"),
            ("n_classes", int, "balanced classes, named class_0, class_1..."),
            ("snr_db", float, "10 log10(signal power / noise power) inside the mask"),
            ("smooth_noise", float, "share of the noise power that is spatially smooth (the "
                                    "rest is white, which feature grouping averages away)"),
            ("n_subjects", int, "group the volumes into subjects, the test split by subject "
                                "(default: no subjects, the test split by class)"),
            ("test_fraction", float, "share of the subjects (or of each class) held out for "
                                     "testing"),
            ("seed", int, "seed of the generator")):
        p.add_argument("--" + name.replace("_", "-"), type=kind, default=default[name], help=text)
    p.add_argument("--grid", type=parse_grid, default=default["grid"], metavar="4mm|2mm|XxYxZ",
                   help="the HCP-small grid (4mm: 33,854 voxels), the HCP grid (2mm: 270,806), "
                        "or a small box of XxYxZ voxels")
    p.add_argument("--four-d", action="store_true",
                   help="one 4D file per subject, class and split, not a 3D file per volume")
    p.add_argument("--target", action="store_true",
                   help="also a continuous target per volume (column target, standard normal, "
                        "with a smooth pattern of its own in the images), for train --task "
                        "regression")


def add_column_args(p, what: str, group: bool = False) -> None:
    """``--label-column`` and ``--target-column`` (and ``--group-column`` with ``group``): a
    cohort table's own names of those columns (a BIDS participants.tsv's diagnosis and age);
    ``what`` says what is done with the label and target."""
    for name, example in (("label", "diagnosis"), ("target", "age")) + (
            (("group", "run"),) if group else ()):
        p.add_argument(f"--{name}-column", default=None, metavar="NAME",
                       help=f"the table's column to read as the {name}"
                            f"{what if name != 'group' else ''}, such as {example} (default: "
                            f"{name}" + (", else subject, participant_id, chunks, ..."
                                         if name == "group" else "") + ")")


def columns_of(args) -> dict:
    """The ``columns`` argument of ``read_cohort`` from :func:`add_column_args`' options."""
    return {"label": args.label_column, "target": args.target_column,
            "group": getattr(args, "group_column", None)}


def add_param(p, name: str, note: str = "") -> None:
    """The option of an estimator parameter, from the table: its type, default and help."""
    from fgscale._utils.constraints import Searchable, Sizes
    from fgscale.estimators._params import param_named

    param = param_named(name)
    # argparse gives an option one word: a list of candidates is typed with commas
    commas = ", comma-separated, such as 0.05,0.1" if isinstance(param.constraint, Searchable) else ""

    def parse(text: str):
        try:
            value = param.constraint.parse(text)
        except ValueError:
            valid, hint = False, ""
        else:  # None may be a value: "--alpha none", the default said in --help
            valid = param.constraint.accepts(value)
            hint = "" if valid else param.constraint.hint(value)
        if not valid:
            raise argparse.ArgumentTypeError(f"expected {param.constraint.describe()}{commas}, "
                                             f"got {text!r}" + (f": {hint}" if hint else ""))
        return value

    default = param.default
    if isinstance(param.constraint, Sizes):  # --hidden-layer-sizes 256 128
        kwargs = {"type": int, "nargs": "+", "default": list(default)}
        default = " ".join(map(str, default))
    else:
        kwargs = {"type": parse, "default": default}
    typed = f"; on the command line a list is{commas[1:]}" if commas else ""
    p.add_argument("--" + name.replace("_", "-"), dest=name, metavar=_metavar(param),
                   help=f"{param.help}{typed} (default: {default}{note})".replace("%", "%%"),
                   **kwargs)  # argparse formats help with %


def _metavar(param) -> str:
    """The words an option takes, where they are few ("{auto,true,false}"), else its name."""
    from fgscale._utils.constraints import Bool, Nothing, Options, Union

    constraint = param.constraint
    words = []
    for option in constraint.options if isinstance(constraint, Union) else (constraint,):
        if isinstance(option, Options):
            words += option.choices
        elif isinstance(option, Bool):  # on/off and yes/no are taken too
            words += ["true", "false"]
        elif isinstance(option, Nothing):
            words += ["none"]
        else:
            return param.name.upper()
    return "{" + ",".join(words) + "}"


def add_bank_args(p, note: str) -> None:
    """The store and the bank's parameters, shared by ``bank`` and ``train``."""
    p.add_argument("store", help="the Zarr store (from fgscale convert)")
    for name in ("n_groupings", "n_bootstrap", "n_clusters"):
        add_param(p, name, note)
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the bank and of training (default: 0)")


def add_estimator_args(p) -> None:
    """The store, then every estimator parameter of the table."""
    from fgscale.estimators._params import PARAMS

    add_bank_args(p, "")
    for param in PARAMS:
        if param.cli and param.name not in ("n_groupings", "n_bootstrap", "n_clusters"):
            add_param(p, param.name)


def add_task_arg(p) -> None:
    p.add_argument("--task", choices=["auto", "classification", "regression"], default="auto",
                   help="classification on the store's labels, regression on its target; "
                        "auto: classification when the store has labels, or with --resume "
                        "the saved run's task")


def add_cv_args(p) -> None:
    p.add_argument("--folds", type=int, default=5, help="number of folds (default: 5)")
    p.add_argument("--out", default=None, metavar="FILE",
                   help="write the results so far to this JSON file after each fold "
                        "(default: none, print only)")
    p.add_argument("--resume", action="store_true",
                   help="continue the cross-validation saved in --out: train only its missing "
                        "folds (no file there: start one, as a requeued job would)")


def add_cluster_args(p, *, used: bool = True) -> None:
    """The options that choose the Dask cluster; with ``used=False``, those of a command that
    needs none (predict, report), taken all the same, so that a script can pass the same
    options to every command, and said unused by :func:`warn_unused_cluster_options`."""
    group = p
    if not used:
        group = p.add_argument_group(f"cluster options (not used: {p.prog.split()[-1]} needs "
                                     "no cluster)")
        p.set_defaults(needs_cluster=False)
    group.add_argument("--scheduler", default=None, help="join a running scheduler "
                       "(tcp://HOST:PORT) (default: $DASK_SCHEDULER_ADDRESS, as Dask's clients "
                       "join it; without it, start a LocalCluster)")
    group.add_argument("--scheduler-file", default=None, help="join the scheduler of this file "
                       "(default: none)")
    group.add_argument("--n-workers", type=positive(int), default=None,
                       help="LocalCluster workers (default: cores)")
    group.add_argument("--timeout", type=positive(float), default=10.0,
                       help="seconds to wait for --scheduler before giving up (default: 10)")
    # argparse deprecates a group in a group: a command without a cluster keeps one group
    tls = p.add_argument_group("TLS, to join a scheduler at tls://HOST:PORT") if used else group
    tls.add_argument("--tls-ca-file", default=None, help="the CA certificate (default: none)")
    tls.add_argument("--tls-cert", default=None, help="this client's certificate (default: none)")
    tls.add_argument("--tls-key", default=None, help="this client's private key (default: none)")


# the destinations of add_cluster_args' options, in its order
_CLUSTER_OPTIONS = ("scheduler", "scheduler_file", "n_workers", "timeout", "tls_ca_file",
                    "tls_cert", "tls_key")


def add_device_arg(p) -> None:
    p.add_argument("--device", default=None,
                   help="torch device (default: the run's own, else the CPU where it has no GPU)")


def add_worker_kind_arg(p) -> None:
    kind = p.add_mutually_exclusive_group()
    kind.add_argument("--worker-processes", dest="worker_kind", action="store_const",
                      const="processes", help="LocalCluster of worker processes, each with a "
                      "memory limit (default for train and cv: threads up to 4 workers, "
                      "processes beyond; for evaluate: threads)")
    kind.add_argument("--worker-threads", dest="worker_kind", action="store_const",
                      const="threads", help="LocalCluster of threads in this process, which hand "
                      "blocks to the model without a copy (default for train and cv up to 4 "
                      "workers, and for evaluate)")


def worker_processes(args, *, auto: bool = True) -> bool:
    """The LocalCluster's kind: the option given, else threads up to 4 workers and processes
    beyond (``processes="auto"``; this command's main module is guarded), or threads with
    ``auto=False`` (evaluation: full rows, which processes would send over a socket)."""
    from fgscale._dask.cores import auto_processes, cpu_count

    if args.worker_kind is not None:
        return args.worker_kind == "processes"
    return auto and auto_processes(args.n_workers or cpu_count(), guarded=True)


def warn_unused_cluster_options(args) -> None:
    """Say which cluster options this command will not use: all those given to a command that
    needs no cluster, the LocalCluster's when it joins a running scheduler (that cluster has its
    own workers), TLS's when it joins none."""
    if not getattr(args, "needs_cluster", True):
        # the options given, not those set: $DASK_SCHEDULER_ADDRESS, which a batch job sets
        # for every command, is nothing to warn of
        given = getattr(args, "given", set())
        unused = ["--" + name.replace("_", "-") for name in _CLUSTER_OPTIONS if name in given]
        if unused:
            warnings.warn(f"{', '.join(unused)} not used: {args.command} needs no cluster (it "
                          "runs in this process)", stacklevel=2)
        return
    joined = args.scheduler is not None or args.scheduler_file is not None
    kind = getattr(args, "worker_kind", None)  # "processes", "threads" or None (not given)
    options = ({"--n-workers": args.n_workers, f"--worker-{kind}": kind is not None} if joined else
               {"--tls-ca-file": args.tls_ca_file, "--tls-cert": args.tls_cert,
                "--tls-key": args.tls_key})
    unused = [name for name, value in options.items() if value]
    if unused:
        warnings.warn(f"{', '.join(unused)} not used: " + (
            "a running scheduler is joined, whose cluster has its own workers" if joined else
            "no scheduler is joined (--scheduler tls://HOST:PORT), and the LocalCluster "
            "started here needs no TLS"), stacklevel=2)


def security_from(args):
    """``distributed.Security`` from the --tls-* options, or None without them."""
    files = (args.tls_ca_file, args.tls_cert, args.tls_key)
    if not any(files):
        return None
    if not all(files):
        raise ValueError("TLS needs --tls-ca-file, --tls-cert and --tls-key together")
    for name in files:
        if not os.path.isfile(name):
            raise FileNotFoundError(f"{name}: no such certificate or key file")
    from distributed import Security

    return Security(tls_ca_file=args.tls_ca_file, tls_client_cert=args.tls_cert,
                    tls_client_key=args.tls_key, require_encryption=True)


def given_options(parser, argv) -> set:
    """The options given on the command line ``argv``, not left to their defaults (the parser
    is spent: its subcommands' defaults are cleared to find them)."""
    for sub in (a for a in parser._actions if isinstance(a, argparse._SubParsersAction)):
        for command in sub.choices.values():
            for action in command._actions:
                action.default = argparse.SUPPRESS
    return set(vars(parser.parse_known_args(argv)[0]))


def saved_unless_given(params: dict, run_dir, given: set) -> dict:
    """``--resume``: the saved run's value of every parameter not given on the command line
    (a resumed 6-epoch run stays a 6-epoch run without ``--max-epochs``), but for the progress
    bars, which this command's ``--no-progress`` sets."""
    from fgscale._utils.files import read_json

    config = os.path.join(run_dir, "config.json")
    if not os.path.isfile(config):
        return params
    return _unless_given(params, read_json(config, "run configuration").get("params", {}), given)


def saved_cv_unless_given(params: dict, args) -> tuple[dict, int, str]:
    """``fgscale cv --resume``: the estimator's parameters, ``--folds`` and ``--task`` of the
    results saved in ``--out`` (or of its first fold's checkpoints, killed before the file was
    written), where the command line gave none (as :func:`saved_unless_given`)."""
    from fgscale.runs._cv_results import saved_header

    if args.out is None:
        raise ValueError("--resume continues the cross-validation saved in --out: give --out")
    saved = saved_header(args.out)
    if saved is None:
        return params, args.folds, args.task
    return (_unless_given(params, saved["params"], args.given),
            args.folds if "folds" in args.given else saved["n_folds"],
            args.task if "task" in args.given else saved["task"])


def _unless_given(params: dict, saved: dict, given: set) -> dict:
    option = {"random_state": "seed"}
    return {k: v if k == "verbose" or k not in saved or option.get(k, k) in given
            else saved[k] for k, v in params.items()}


def one_line_warnings(command: str) -> None:
    """fgscale's own warnings said in one line, as its errors are (``fgscale train: warning:
    ...``), not with the source line that raised them; other libraries' keep their format."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # fgscale/, above cli/
    # a warning at its caller's line (an estimator's) names the command's start: the console
    # script, or runpy for python -m fgscale
    starts = {"<frozen runpy>", os.path.abspath((sys.argv or [""])[0])}
    default = warnings.formatwarning

    def formatwarning(message, category, filename, lineno, line=None):
        where = os.path.abspath(filename)
        if where.startswith(package + os.sep) or filename in starts or where in starts:
            return f"fgscale {command}: warning: {as_options(str(message))}\n"
        return default(message, category, filename, lineno, line)

    warnings.formatwarning = formatwarning


def as_options(message: str) -> str:
    """A library message in the command line's words: a parameter named to be passed, with no
    value (``give a larger max_epochs= to ...``), becomes its option (``--max-epochs``); a value
    said (``reached max_epochs=2``) is left as it is."""
    from fgscale.estimators._params import PARAMS

    names = "|".join(p.name for p in PARAMS if p.cli)
    return re.sub(rf"\b({names})=(?=[\s,;:)]|$)",
                  lambda m: "--" + m.group(1).replace("_", "-"), message)


def client_of(args, *, processes: bool):
    """Where --scheduler, --scheduler-file and --n-workers become a client: a running cluster
    joined, else None within a deferred embedded LocalCluster (processes or threads) that the
    first step with work starts: a command with nothing to do, or refused, starts none."""
    from fgscale._dask.client import connect, deferred_cluster

    if args.scheduler is not None or args.scheduler_file is not None:
        if args.scheduler is not None and args.scheduler_file is not None:
            raise ValueError("give --scheduler or --scheduler-file, not both")
        return connect(args.scheduler, args.scheduler_file, timeout=args.timeout,
                       security=security_from(args), origin=getattr(args, "scheduler_origin", None))
    return deferred_cluster(n_workers=args.n_workers, processes=processes)


def estimator_params(args) -> dict:
    from fgscale.estimators._params import PARAMS

    params = {p.name: getattr(args, p.name) for p in PARAMS if p.cli}
    return {**params, "verbose": int(not args.no_progress), "random_state": args.seed}
