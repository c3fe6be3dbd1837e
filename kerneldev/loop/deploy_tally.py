"""The `Deployed: ... / Not deployed: ...` summary of a deploy that did not run to its end.

An interrupted or partial deploy (and a push stopped before its uploads or after them, in the
restart) ends with an error whose message closes with these two lines. What they say is data
first: `errors.DeployTally` on the error's `tally`; the lines are built from it here, in one
place, and code decides on `tally`, never on the message's text.
"""

from __future__ import annotations

from collections.abc import Sequence

from kerneldev.errors import DeployTally, KerneldevError
from kerneldev.printable import printable_list

SHOWN = 20  # paths listed before the rest is counted
BEFORE_UPLOAD = "everything (stopped before the upload)"


def names(paths: Sequence[str], limit: int = SHOWN) -> str:
    """A list of paths for a message: all of them up to `limit`, then a count."""
    if not paths:
        return "(none)"
    shown = printable_list(paths[:limit])
    return shown if len(paths) <= limit else f"{shown} and {len(paths) - limit} more"


def summary(tally: DeployTally) -> str:
    """The two lines, built from the data."""
    deployed = names(tally.deployed)
    if tally.deploy_id and tally.deployed:
        deployed += f" as {tally.deploy_id}"
    left = BEFORE_UPLOAD if tally.not_deployed is None else names(tally.not_deployed)
    return f"Deployed: {deployed}\nNot deployed: {left}"


def attach(err: KerneldevError, tally: DeployTally) -> KerneldevError:
    """Give `err` its tally and end its message with the summary (once: an error that has a
    tally keeps the one it has). Returns `err`."""
    if err.tally is None:
        err.tally = tally
        err.message += "\n" + summary(tally)
    return err


def stopped_at(landed: Sequence[str] | None, deploy_id: str | None = None) -> DeployTally:
    """The tally of a push stopped outside its uploads: before them (`landed` None: nothing
    ran) or after them (every planned file landed)."""
    if landed is None:
        return DeployTally((), None)
    return DeployTally(tuple(landed), (), deploy_id)
