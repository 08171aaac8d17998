"""The ``serverless-gpu`` command: ``run`` a script on every rank, and ``runs`` to look at runs.

serverless-gpu run --gpus 2 --gpu-type cpu train.py -- --epochs 2
serverless-gpu run -m pkg.train --epochs 2
serverless-gpu run -f job.yaml [--detach] [--override KEY=VALUE] [--dry-run]
serverless-gpu run job.yaml          # also a job file of the air CLI's format (see airjob.py)
serverless-gpu runs list | show ID | logs ID [--rank N] [--follow] | cancel ID
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import yaml

from serverless_gpu.api.scripts import ScriptTarget
from serverless_gpu.cli.jobfile import JobSpec, load_job
from serverless_gpu.cli.overrides import variadic_overrides
from serverless_gpu.cli.run_options import job_options, job_value, option_flags
from serverless_gpu.common.errors import ConfigurationError, DistributedError

# Everything after the script (or module) belongs to it, as with `python script.py args`.
_RUN_SETTINGS = {"allow_interspersed_args": False, "help_option_names": ["-h", "--help"]}


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Run a Python script on every GPU of this machine, tracked in MLflow, and look at runs."""


class _RunCommand(click.Command):
    """``run``, taking several values after one ``--override`` as air does."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        takes_value = {
            opt
            for p in self.params
            if isinstance(p, click.Option) and not p.is_flag
            for opt in p.opts
        }
        return super().parse_args(ctx, variadic_overrides(args, takes_value))


@main.command(cls=_RunCommand, context_settings=_RUN_SETTINGS)
@click.option("-f", "--file", "job_file", type=click.Path(dir_okay=False), help="A YAML job file.")
@click.option("-m", "as_module", is_flag=True, help="Run the first argument as a module.")
@option_flags  # --gpus, --gpu-type, --timeout, --output, --name ...: common/options.py
@click.option("--experiment", help="The MLflow experiment (default: MLflow's).")
@click.option("-e", "--env", "env", multiple=True, help="KEY=VALUE for every rank (repeatable).")
@click.option("--detach", is_flag=True, help="Start the run in the background and return.")
@click.option(
    "--override",
    "overrides",
    multiple=True,
    metavar="KEY=VALUE",
    help="Set a job file's keys (dotted: compute.num_accelerators=2 max_retries=0).",
)
@click.option(
    "--watch", is_flag=True, help="Follow the run until it ends (the default without --detach)."
)
@click.option(
    "--idempotency-key",
    help="Accepted for air's command line; ignored here (nothing is submitted twice).",
)
@click.option("--dry-run", is_flag=True, help="Print the job as it would run; run nothing.")
@click.option("--announce-fd", type=int, hidden=True)
@click.option("--job-fd", type=int, hidden=True)
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def run(**params: Any) -> None:
    """Run SCRIPT [-- ARGS] (or -m MODULE ARGS, or -f job.yaml) on every rank.

    Each rank runs the script as `torchrun` would (RANK, WORLD_SIZE, MASTER_ADDR ... set,
    __name__ == "__main__"). Exit status: 0 success, 1 a rank failed, 2 bad options,
    124 timed out, 130 interrupted or cancelled.
    """
    from serverless_gpu.cli.launch import detach, read_job, run_job

    ctx = click.get_current_context()
    command = params["command"]
    if not params["job_file"] and command and command[0].endswith((".yaml", ".yml")):
        # `serverless-gpu run job.yaml [options]` (as `air run job.yaml`): a Python script is
        # never named so, and the options after the file are this command's, not a script's.
        with run.make_context(ctx.info_name, ["-f", *command], parent=ctx.parent) as again:
            run.invoke(again)
    if params["watch"] and params["detach"]:
        raise BadRun("--watch follows the run and --detach returns at once: give one of them")
    if params["idempotency_key"]:
        _say_ignored("--idempotency-key", "nothing is submitted to a service here")
    try:
        if params["job_file"] and params["job_fd"] is None:
            _run_file(ctx, params)
        job = read_job(params["job_fd"]) if params["job_fd"] is not None else _job(ctx, params)
        if not isinstance(job, JobSpec):  # air's format, in the process --detach started
            from serverless_gpu.cli.airdetach import run_recorded

            ctx.exit(run_recorded(job, params["announce_fd"]))
        if params["dry_run"]:
            ctx.exit(_print(yaml.safe_dump(job.model_dump(exclude_defaults=True), sort_keys=False)))
        if params["detach"]:
            ctx.exit(detach(job))
        ctx.exit(run_job(job, params["output"], params["announce_fd"]))
    except (ConfigurationError, DistributedError) as exc:
        raise BadRun(str(exc)) from None


class BadRun(click.ClickException):
    """A run that cannot start as asked: its reason, and exit status 2."""

    exit_code = 2


def _run_file(ctx: click.Context, params: dict[str, Any]) -> None:
    """A job file of air's format runs here (and ends the command); ours falls through."""
    from serverless_gpu.cli.airjob import AirJob
    from serverless_gpu.cli.airrun import effective, run_air_job, say_ignored

    if params["command"]:
        raise ConfigurationError("give a job file (-f) or a script, not both")
    job = load_job(params["job_file"], params["overrides"])
    if not isinstance(job, AirJob):
        return
    options = [(o.name, o.flag) for o in job_options()] + [("experiment", "--experiment")]
    given = [flag for name, flag in [*options, ("env", "--env")] if _on_line(ctx, name)]
    if given:
        raise ConfigurationError(
            f"{', '.join(given)}: not for a job file of air's format; set its keys with "
            "--override (compute.num_accelerators=2, env_variables.KEY=VALUE, max_retries=0)"
        )
    job_dir = Path(params["job_file"]).absolute().parent
    if params["dry_run"]:
        say_ignored(job)
        ctx.exit(_print(effective(job, job_dir)))
    if params["detach"]:  # followed with `serverless-gpu runs`, as a detached run of ours
        from serverless_gpu.cli.airdetach import placed
        from serverless_gpu.cli.launch import detach

        ctx.exit(detach(placed(job, job_dir)))
    ctx.exit(run_air_job(job, job_dir))


def _say_ignored(option: str, why: str) -> None:
    click.echo(f"serverless-gpu: {option} is ignored here: {why}", err=True)


def _on_line(ctx: click.Context, option: str) -> bool:
    return ctx.get_parameter_source(option) is click.core.ParameterSource.COMMANDLINE


def _print(text: str) -> int:
    click.echo(text, nl=False)
    return 0


def _job(ctx: click.Context, params: dict[str, Any]) -> JobSpec:
    """The run asked for: the job file (or the script), with the options given overriding it."""
    command = list(params["command"])
    if params["job_file"]:
        job = load_job(params["job_file"], params["overrides"])
        assert isinstance(job, JobSpec)  # air's format is run by _run_file
        base: dict[str, Any] = job.model_dump(exclude_defaults=True)
    else:
        if params["overrides"]:
            raise ConfigurationError("--override sets a job file's keys: give one with -f")
        base = {**_command(command, params["as_module"])}
    for option in job_options():
        if _on_line(ctx, option.name):
            base[option.job_key] = job_value(option, params[option.name])
    if _on_line(ctx, "experiment"):
        base["experiment_name"] = params["experiment"]
    if params["env"]:
        base["env"] = {**base.get("env", {}), **dict(_pair(item) for item in params["env"])}
    job = JobSpec.model_validate(base)
    return _resolved(job)


def _command(command: list[str], as_module: bool) -> dict[str, Any]:
    if not command:
        raise ConfigurationError("nothing to run: give a script, -m MODULE or -f job.yaml")
    head, args = command[0], command[1:]
    if args[:1] == ["--"]:  # `script.py -- args`: the separator is ours, not the script's
        args = args[1:]
    return {"module" if as_module else "script": head, "args": args}


def _pair(item: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise ConfigurationError(f"--env takes KEY=VALUE, not {item!r}")
    return key, value


def _resolved(job: JobSpec) -> JobSpec:
    """The job with its target resolved (a script's absolute path), so that a detached run
    finds the same script; raises for a missing script or a command that is not Python."""
    target: ScriptTarget = job.target()
    fields = job.model_dump(exclude={"command", "script", "module", "args"})
    if target.module is not None:
        return JobSpec(module=target.module, args=list(target.args), **fields)
    return JobSpec(script=target.path, args=list(target.args), **fields)


@main.group()
def runs() -> None:
    """Runs of this user on this machine (newest first), from their run directories."""


@runs.command("list")
@click.option("-n", "--limit", type=click.IntRange(min=1), default=20, show_default=True)
def runs_list(limit: int) -> None:
    """ID, name, status, GPUs, start, duration and MLflow link of the latest runs."""
    from serverless_gpu.cli.runs import list_table

    try:
        lines = list_table(limit)
    except ConfigurationError as exc:  # e.g. a runs folder that is not safe to read
        raise BadRun(str(exc)) from None
    for line in lines:
        click.echo(line)


@runs.command("show")
@click.argument("run_id")
def runs_show(run_id: str) -> None:
    """Everything known about one run: record, logs, MLflow run and its latest metrics."""
    from serverless_gpu.caller.runrecord import find_run
    from serverless_gpu.cli.runs import show_lines

    for line in show_lines(_found(find_run, run_id)):
        click.echo(line)


@runs.command("logs")
@click.argument("run_id")
@click.option("--rank", type=click.IntRange(min=0), help="Only this rank's log.")
@click.option("--follow", is_flag=True, help="Keep printing until the run ends.")
def runs_logs(run_id: str, rank: int | None, follow: bool) -> None:
    """A run's per-rank logs ([rank N] prefixes when there are several)."""
    from serverless_gpu.caller.runrecord import find_run
    from serverless_gpu.cli.runs import print_logs

    run = _found(find_run, run_id)
    try:
        code = print_logs(run, rank, follow)
    except ConfigurationError as exc:
        raise BadRun(str(exc)) from None
    click.get_current_context().exit(code)


@runs.command("cancel")
@click.argument("run_id")
def runs_cancel(run_id: str) -> None:
    """Stop a run started with `serverless-gpu run` (e.g. --detach): every rank ends."""
    from serverless_gpu.caller.runrecord import cancel, find_run

    run = _found(find_run, run_id)
    try:
        status = cancel(run)
    except ConfigurationError as exc:
        raise BadRun(str(exc)) from None
    click.echo(f"{run.run_id}: {status}")


def _found(find: Any, run_id: str) -> Any:
    try:
        return find(run_id)
    except ConfigurationError as exc:
        raise BadRun(str(exc)) from None
