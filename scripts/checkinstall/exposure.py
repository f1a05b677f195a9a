"""Whether a deployment's configuration reaches the race: its launch settings, judged
against the races open at the install's step and race-check's scenario catalogue."""

from collections.abc import Mapping
from typing import NamedTuple

from patchset.errors import Exit
from patchset.manifest import RaceEntry
from patchset.plays import PLAYS
from patchset.releases import LaunchSettings

from checkinstall import launchargs, serverargs, serverinfo
from checkinstall.launchargs import FIELDS, Settings

HISPARSE_SCENARIO = "H1"  # the hisparse seam: _build_hisparse_decode_batch's stash
WAR_BARRIER_ENV = "SGLANG_ENABLE_WAR_BARRIER"
TIMEOUT_S = 10.0


def from_server_info(
    url: str, api_key: str | None, table: LaunchSettings | None, timeout: float | None
) -> Settings:
    info, shown = serverinfo.read_server_info(url, api_key, timeout or TIMEOUT_S)
    values = {name: info.get(name) for name in FIELDS}
    odd = [
        f"{name} is {value!r}"
        for name, value in values.items()
        if value is not None and not isinstance(value, launchargs.KINDS[name])
    ]
    if values["disaggregation_mode"] not in launchargs.DISAGGREGATION_MODES:
        odd.append(f"disaggregation_mode is {values['disaggregation_mode']!r}")
    if odd:
        raise launchargs.not_understood(
            f"--server-info {shown} answers values no sglang server has: {'; '.join(odd)}",
            "point it at the sglang server itself (its host and port)",
        )
    algorithm = str(values["speculative_algorithm"] or "")
    eagle = launchargs.eagle_family(algorithm, table) if table else algorithm.startswith("EAGLE")
    parser = f"the running server's {shown} (its values after sglang's own adjustments)"
    return Settings(values, parser, eagle, adjusted=True)


class Exposure(NamedTuple):
    code: Exit
    lines: list[str]  # one setting per line, then the verdict


def judge(
    settings: Settings,
    races: Mapping[str, tuple[RaceEntry, ...]],  # scenario -> its [races] entries at the step
    table: LaunchSettings | None,
    install: str,  # the install's verdict line
) -> Exposure:
    keeps_out: list[str] = []  # the settings that keep the deployment out
    mode = str(settings.get("disaggregation_mode") or "null")
    reach = "the prebuilt path reaches the race"
    if mode != "decode":
        reach = "only decode seeds prebuilt rows, so this server does not reach the race"
        keeps_out.append(f"--disaggregation-mode {mode} (serving as decode exposes it)")
    lines = [f"configuration parsed by {settings.parser}", f"disaggregation mode: {mode}: {reach}"]

    overlap_on = not settings.get("disable_overlap_schedule")
    if overlap_on:
        line = "overlap scheduling: on (no --disable-overlap-schedule"
        line += ", and sglang's adjustments that ran left it on)" if settings.adjusted else ")"
        if settings.not_evaluated:
            line += "; not evaluated here: " + "; ".join(settings.not_evaluated)
        lines.append(line)
    else:
        by = ", ".join(settings.turned_off_by)
        by = f"sglang turned it off ({by})" if by else "--disable-overlap-schedule"
        lines.append(f"overlap scheduling: off ({by}): one stream, nothing races")
        keeps_out.append(f"overlap off ({by}; turning overlap on exposes it)")

    algorithm = settings.get("speculative_algorithm") or "none"
    plays = [p for p in PLAYS if bool(p.spec) == settings.eagle and p.name in races]
    family = "EAGLE family" if settings.eagle else "not EAGLE"
    writes = "all five relay buffers" if settings.eagle else "output_tokens_buf only"
    lines.append(f"speculative algorithm: {algorithm} ({family}): the seeding writes {writes}")

    given = settings.get("device")
    device = str(given or serverargs.DEFAULT_DEVICE)
    named = device if given else f"{device} (not given: sglang picks cuda with a GPU)"
    if device == "cuda" and settings.torch_build == "rocm":
        named += f", {settings.torch_source}"
    raw = settings.env.get(WAR_BARRIER_ENV)
    # None: a value sglang's EnvBool does not read
    read = "unset" if raw is None else launchargs.ENV_BOOL.get(raw.lower())
    on = ""  # what turns the WAR barrier on, if anything
    if device == "cuda" and settings.torch_build != "rocm":
        on = f"is_cuda() ({settings.torch_source})"
    elif read is True and table is not None and table.war_barrier_env:
        on = f"{WAR_BARRIER_ENV} is set in the server's environment"
    if on:
        graphs_off = settings.get("disable_cuda_graph") or settings.get("disable_decode_cuda_graph")
        fast = bool(table and table.war_fast_path) and not graphs_off
        barrier = "fast" if fast else "fallback"
        why = "a decode graph replay records the read-done event it waits on"
        if not fast:
            off = "CUDA graphs are off" if graphs_off else "this release has no fast path"
            why = f"{off}: it waits on the whole forward stream"
        lines.append(f"device: {named}: the WAR barrier is on, {on}; {barrier} path ({why})")
    else:
        barrier = "none"
        reason = {
            True: f"{WAR_BARRIER_ENV}={raw} is set, but this release reads it only on CUDA",
            False: f"is_cuda() is false and {WAR_BARRIER_ENV}={raw} is false",
            None: f"is_cuda() is false, and {WAR_BARRIER_ENV}={raw!r} is no value sglang's "
            "EnvBool reads (true/1/yes/y, false/0/no/n, any case): sglang warns and takes its "
            "default, false",
            "unset": f"is_cuda() is false and {WAR_BARRIER_ENV} is not set (--env)",
        }[read]
        lines.append(f"device: {named}: the WAR barrier is off ({reason})")
    loop = [p.name for p in plays if p.barrier == barrier]
    played = loop + ([p.name for p in plays if p.barrier is None] if barrier == "none" else [])
    open_ = [name for name in played if races.get(name)]
    if not open_ and played:
        keeps_out.append(
            f"the WAR barrier's {barrier} path ({', '.join(loop)} played with it: ordered); "
            "a device without the barrier, or another barrier path, exposes it"
        )

    hisparse, seam = bool(settings.get("enable_hisparse")), HISPARSE_SCENARIO
    # a server's own prefill-to-decode transition, whatever its disaggregation mode but prefill
    hisparse_open = hisparse and bool(races.get(seam)) and mode != "prefill"
    if seam not in races:
        said = f"{'on' if hisparse else 'off'}; not played for this release (no [races.{seam}])"
    elif not hisparse:
        said = "off (--enable-hisparse not given)"
    elif races[seam]:
        said = f"on: the hisparse stash races at this step ({seam} open)"
    else:
        said = f"on: {seam} was played on this release's code and found ordered"
    lines.append(f"hisparse: {said}")

    reaching = (open_ if mode == "decode" else []) + ([seam] if hisparse_open else [])
    buffers = dict.fromkeys(b for name in reaching for _, names, _ in races[name] for b in names)
    if settings.unsettled:
        lines.append("not understood: " + "; ".join(settings.unsettled))
    keeps = "; ".join(keeps_out or ["no scenario this configuration plays is open at this step"])
    if reaching and overlap_on:
        code = Exit.EXPOSED
        verdict = (
            f"exposed: {install}; this configuration reaches the race: scenarios "
            f"{', '.join(reaching)}; buffers {', '.join(buffers)}"
        )
    elif settings.unsettled:
        code = Exit.EXPOSURE_UNKNOWN
        verdict = (
            f"exposure unknown: {install}; as read, this configuration would not reach the "
            f"race ({keeps}), but what was not understood may change that"
        )
    else:
        code = Exit.NOT_EXPOSED
        verdict = f"not exposed: {install}; this configuration does not reach the race: {keeps}"
    return Exposure(code, [*lines, f"verdict: {verdict}"])
