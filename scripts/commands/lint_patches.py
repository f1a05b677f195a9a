"""Lint the patch series: series, patches and pin manifest must agree."""

from patchset import cli
from patchset.errors import BackportError, Exit
from patchset.lint import RULES, lint_patch_set

DESCRIPTION = (
    "Check a patch set folder against these rules:\n"
    + "\n".join(f"  {rule:16} {what}" for rule, what in RULES.items())
    + """

Prints one line per problem (FILE:LINE: [rule] message) and a summary.
Needs no network and no build tree; a run that checked nothing fails.
"""
)

CODES = [Exit.PATCHSET_INVALID]
WORDING = {
    Exit.OK: "the patch set is clean",
    Exit.PATCHSET_INVALID: "a rule found a problem, or the lint checked nothing",
}


def main() -> int:
    p = cli.parser("lint-patches", DESCRIPTION, CODES, WORDING)
    cli.add_patch_set(p)
    args = p.parse_args()
    report = lint_patch_set(args.patch_set)
    for violation in report.violations:
        print(violation.render())
    checked = ", ".join(f"{rule} {n}" for rule, n in sorted(report.checked.items()))
    summary = f"{len(report.patches)} patches in {args.patch_set} (checked: {checked})"
    if not report.violations:
        print(f"lint ok: {summary}")
        return Exit.OK
    raise BackportError(
        Exit.PATCHSET_INVALID,
        f"{len(report.violations)} problems in {summary}",
        "fix each line above; patch content is changed on the patched branch and "
        "re-exported with scripts/export-patches",
    )
