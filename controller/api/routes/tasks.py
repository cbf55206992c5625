"""``/api/v1/tasks``: list, create, restart many; one task's description, pause, resume, stop, restart, reassign,
delete, its offsets and their reset."""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Body, Header, Query, Response

from controller.admin import to_dict
from controller.admin.task_apply import StaleVersion, identity_of
from controller.admin.views import json_object
from controller.api.context import API, ApiContext
from controller.api.errors import ApiError, error_response
from controller.protocol.tasks.spec import SpecError, parse_spec
from controller.protocol.tasks.storage import MAX_LOG_LINES, MAX_TIMEOUT_S, ResetTarget, StorageError


def router(ctx: ApiContext) -> APIRouter:
    r = APIRouter(prefix=f"{API}/tasks", tags=["tasks"])

    @r.get(
        "",
        summary="List tasks (filters and paging). With `cursor` (empty for the first page) a page is "
        "read at the source and X-Next-Cursor holds the next page's cursor (absent after the last); without "
        "it every task is read, and X-Total-Count holds the total",
    )
    def list_tasks(
        group: str | None = None,
        state: str | None = None,
        owner: str | None = None,
        offset: int = Query(0, ge=0),
        limit: int | None = Query(None, ge=1, le=100_000),
        cursor: str | None = Query(None, max_length=200),
    ) -> Response:
        if cursor is not None:
            page = ctx.admin().list_page(
                group=group, state=state, broker=owner, limit=limit or 50, cursor=cursor or None
            )
            headers = {} if page.next_cursor is None else {"X-Next-Cursor": page.next_cursor}
            return Response(
                json.dumps([to_dict(row) for row in page.rows], separators=(",", ":")),
                media_type="application/json",
                headers=headers,
            )
        rows = ctx.admin().list_tasks(group)
        if state:
            wanted = state.upper()
            rows = [row for row in rows if wanted in (row.state, row.status, row.shown)]
        if owner:
            rows = [row for row in rows if row.owner == owner]
        page_rows = rows[offset : None if limit is None else offset + limit]
        # serialised directly: at 10,000 rows FastAPI's generic encoder costs more than reading ZooKeeper
        return Response(
            json.dumps([to_dict(row) for row in page_rows], separators=(",", ":")),
            media_type="application/json",
            headers={"X-Total-Count": str(len(rows))},
        )

    @r.post("", summary="Create one task or a list (validated as `zkctl task create`)")
    def create_tasks(response: Response, body: Any = Body(...), dry_run: bool = False) -> dict[str, Any]:
        objs = body if isinstance(body, list) else [body]
        if not objs:
            raise SpecError("no task specs given")
        specs = [parse_spec(o, f"spec {i + 1}" if len(objs) > 1 else "spec") for i, o in enumerate(objs)]
        result = ctx.admin().create_tasks(specs, dry_run=dry_run)
        response.status_code = 200 if dry_run else 201
        return json_object(result)

    @r.post(
        "/restart",
        summary="Restart many tasks in one batched write: every FAILED one "
        "(only_failed, as Kafka Connect's KIP-745), of a group",
    )
    def restart_many(only_failed: bool = Query(True), group: str | None = None) -> dict[str, Any]:
        return json_object(ctx.admin().restart_tasks(group=group, only_failed=only_failed))

    @r.get("/{task_id}", summary="A task: spec, owner, status, last error; ETag: its spec version")
    def describe_task(task_id: str, response: Response) -> dict[str, Any]:
        d = ctx.admin().describe_task(task_id)
        if d.spec_version is not None:
            response.headers["ETag"] = f'"{d.spec_version}"'
        return json_object(d)

    @r.put(
        "/{task_id}",
        summary="Create or change one task (as `zkctl task apply`); If-Match: the spec version (ETag) the change "
        "was made against (412 when the task is at another); reset (a STOPPED task) also resets its checkpoint",
    )
    def put_task(
        task_id: str,
        response: Response,
        body: Any = Body(...),
        if_match: str | None = Header(None, max_length=40),
        dry_run: bool = False,
        reset: bool = False,
        wait: bool = False,
        timeout: float = 60.0,
    ) -> Any:
        if not isinstance(body, dict):
            raise SpecError("the body must be one task spec (a JSON object)")
        if body.get("id", task_id) != task_id:
            raise ApiError(422, "invalid_parameter", f"the spec's id {body.get('id')!r} is not the path's {task_id!r}")
        spec = parse_spec({**body, "id": task_id})
        waited = ctx.waited(wait, timeout)
        admin = ctx.admin()
        if (
            if_match is not None
            and if_match.strip() == "*"
            and not admin.reads.wave([ctx.config.layout.task(task_id)])[0][0]
        ):
            raise StaleVersion(f"If-Match: * names a task that exists; {task_id!r} does not")
        who = f"api ({'admin token' if ctx.config.token else 'no token'}; {identity_of(ctx.config.client)})"
        res = admin.apply([spec], dry_run=dry_run, if_version=if_match_version(if_match), reset=reset, who=who)
        item = res.items[0]
        if item.to_revision is not None:
            response.headers["ETag"] = f'"{item.to_revision}"'
        response.status_code = 201 if item.action == "create" and not dry_run else 200
        body_out = json_object(item)
        if waited > 0 and not dry_run and item.action != "unchanged" and item.state in ("RUNNING", "STOPPED"):
            done = admin.wait([task_id], "running" if item.state == "RUNNING" else "stopped", waited)
            if not done.reached:
                return error_response(504, "timeout", f"applied, not yet running it: waiting for {done.waiting[0][1]}")
        return body_out

    @r.get("/{task_id}/history", summary="A task's recorded changes, stops and resets, and its kept spec versions")
    def history(task_id: str) -> dict[str, Any]:
        admin = ctx.admin()
        admin.describe_task(task_id)  # 404 for an unknown task
        return json_object(admin.history(task_id))

    @r.post("/{task_id}/rollback", summary='Apply again a kept spec version: {"to_version": N}')
    def rollback(task_id: str, body: Any = Body(...), dry_run: bool = False, reset: bool = False) -> dict[str, Any]:
        to = body.get("to_version") if isinstance(body, dict) else None
        if type(to) is not int or to < 1:
            raise ApiError(422, "invalid_parameter", 'the body must be {"to_version": N} with N a spec version')
        who = f"api ({'admin token' if ctx.config.token else 'no token'}; {identity_of(ctx.config.client)})"
        return json_object(ctx.admin().rollback(task_id, to, dry_run=dry_run, reset=reset, who=who))

    @r.get(
        "/{task_id}/wait",
        summary="Wait (bounded by timeout) until the task is running, stopped or deleted; 504 with what it waits "
        "for when not",
    )
    def wait_task(task_id: str, condition: str = Query(..., alias="for"), timeout: float = 30.0) -> Any:
        res = ctx.admin().wait([task_id], condition, ctx.waited(True, timeout))
        if not res.reached:
            return error_response(504, "timeout", f"not {condition}: waiting for {res.waiting[0][1]}")
        return json_object(res)

    @r.delete(
        "/{task_id}",
        summary="Delete a task (the controller revokes it first); purge_checkpoint (with wait) also removes its "
        "streaming checkpoint once it is deleted",
    )
    def delete_task(task_id: str, wait: bool = False, timeout: float = 60.0, purge_checkpoint: bool = False) -> Any:
        if purge_checkpoint and not wait:
            raise ApiError(422, "invalid_parameter", "purge_checkpoint needs wait=true")
        waited = ctx.waited(wait, timeout)
        return ctx.done_or_504(ctx.admin().delete_task(task_id, wait=waited, purge_checkpoint=purge_checkpoint), wait)

    @r.put("/{task_id}/pause", summary="Pause a task")
    def pause(task_id: str) -> dict[str, Any]:
        return json_object(ctx.admin().pause(task_id))

    @r.put("/{task_id}/resume", summary="Resume a task")
    def resume(task_id: str) -> dict[str, Any]:
        return json_object(ctx.admin().resume(task_id))

    @r.put(
        "/{task_id}/stop",
        summary="Stop a task: STOPPED, and with wait, confirmed from ZooKeeper not to run anywhere (504 if not "
        "within the timeout)",
    )
    def stop(task_id: str, wait: bool = False, timeout: float = 60.0) -> Any:
        res = ctx.admin().stop(task_id, wait=ctx.waited(wait, timeout))
        if wait and not res.confirmed:
            return error_response(504, "timeout", f"not confirmed stopped: waiting for {res.waiting_for}")
        return json_object(res)

    def answer_within(timeout: float) -> float:
        if not 0 < timeout <= MAX_TIMEOUT_S:
            raise ApiError(422, "invalid_parameter", f"timeout must be more than 0 and at most {MAX_TIMEOUT_S:g}")
        return min(timeout, ctx.config.max_wait_s)

    @r.get(
        "/{task_id}/offsets",
        summary="A streaming task's offsets, read from its checkpoint by the broker that holds it (504: no answer "
        "within the timeout)",
    )
    def offsets(task_id: str, timeout: float = 30.0) -> dict[str, Any]:
        return json_object(ctx.admin().offsets(task_id, timeout=answer_within(timeout)))

    @r.get(
        "/{task_id}/logs",
        summary="The last lines of the pipeline's own log, from the broker that runs or last ran it (since: the "
        "byte offset a previous answer ended at, to follow it)",
    )
    def logs(task_id: str, tail: int = 100, since: int | None = None, timeout: float = 30.0) -> dict[str, Any]:
        if not 1 <= tail <= MAX_LOG_LINES or (since is not None and since < 0):
            raise ApiError(422, "invalid_parameter", f"tail must be 1 to {MAX_LOG_LINES}; since not negative")
        return json_object(ctx.admin().task_logs(task_id, tail=tail, since=since, timeout=answer_within(timeout)))

    @r.post(
        "/{task_id}/reset-offsets",
        summary='Reset a STOPPED task\'s offsets: {"to": "earliest"} | {"to": "latest"} | {"to_batch": N}',
    )
    def reset_offsets(
        task_id: str, body: Any = Body(...), dry_run: bool = False, timeout: float = 30.0
    ) -> dict[str, Any]:
        if not isinstance(body, dict) or not set(body) <= {"to", "to_batch"}:
            raise ApiError(422, "invalid_parameter", 'the body must be {"to": "earliest"|"latest"} or {"to_batch": N}')
        to = body.get("to")
        if to is not None and to not in ("earliest", "latest"):
            raise ApiError(422, "invalid_parameter", '"to" must be "earliest" or "latest"')
        try:
            target = ResetTarget.parse(to == "earliest", to == "latest", body.get("to_batch"))
        except StorageError as exc:
            raise ApiError(422, "invalid_parameter", str(exc)) from None
        return json_object(ctx.admin().reset_offsets(task_id, target, dry_run=dry_run, timeout=answer_within(timeout)))

    @r.post("/{task_id}/restart", summary="Restart a task (its owner stops and starts it)")
    def restart(task_id: str) -> dict[str, Any]:
        return json_object(ctx.admin().restart(task_id))

    @r.post("/{task_id}/reassign", summary='Move a task to a broker: {"to": broker}')
    def reassign(task_id: str, body: dict[str, Any] = Body(...), wait: bool = False, timeout: float = 60.0) -> Any:
        to = body.get("to")
        if not isinstance(to, str) or not to:
            raise ApiError(422, "invalid_parameter", 'the body must be {"to": "<broker id>"}')
        return ctx.done_or_504(ctx.admin().reassign(task_id, to, wait=ctx.waited(wait, timeout)), wait)

    return r


def if_match_version(header: str | None) -> int | None:
    """The spec version an ``If-Match`` header names (``"3"``, ``3``, ``W/"3"``; ``*``: any), or a 412 error."""
    if header is None or header.strip() == "*":
        return None
    value = header.strip().removeprefix("W/").strip('"')
    if not value.isdigit() or len(value) > 15 or int(value) < 1:
        raise StaleVersion(f'If-Match must name one spec version (an ETag such as "3"), not {header[:40]!r}')
    return int(value)
