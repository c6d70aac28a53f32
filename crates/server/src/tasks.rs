//! `run_python` as a task: started by a `tools/call` that asks for one, then polled, waited on,
//! listed and cancelled by the client that started it. One kind of task, two wire forms: the
//! tasks extension (SEP-2663) through rmcp's handlers, and 2025-11-25's through the custom
//! methods [`crate::legacy_tasks`] renames its requests to.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::RoleServer;
use rmcp::model::{
    CallToolRequestParams, CustomRequest, CustomResult, DetailedTask, ErrorData, GetTaskResult,
    InputResponses, Task, TaskPayload,
};
use rmcp::service::RequestContext;
use rmcp::task_manager::{TaskExit, TaskManager, TaskOptions};
use serde_json::{Value, json};

use crate::legacy_tasks::PREFIX;
use crate::link::{ClientApprover, PeerLink};
use crate::replies::refused;
use crate::run::Calls;
use crate::tool::{RunArgs, call_args};
use bridge_core::config::Config;
use bridge_core::identity::{Identity, SessionKey};
use bridge_core::policy::Approver;
use bridge_upstream::CallRelay;

/// How often a task's client is told to poll it.
const TASK_POLL_MS: u64 = 500;
/// How long a task's result is kept for its client after the longest call could have ended.
const TASK_RETENTION: Duration = Duration::from_secs(300);
/// How often `tasks/result` looks whether its task has ended.
const RESULT_POLL: Duration = Duration::from_millis(50);
/// How long `tasks/cancel` waits for the code to stop before it answers with the task as it is.
const CANCEL_WAIT: Duration = Duration::from_secs(10);
/// Tasks per `tasks/list` page.
const LIST_PAGE: usize = 100;
/// The `_meta` key that ties a task's result to its task (2025-11-25).
const RELATED_TASK: &str = "io.modelcontextprotocol/related-task";
/// Tasks of one session not yet ended. A task is answered at once and then waits for its
/// session (its calls run one at a time), so without a bound a client could queue any number,
/// each holding its code: these keep what one session's queue holds within its memory bound
/// (SECURITY.md).
const TASKS_PER_SESSION: usize = 8;
/// Bytes of code of one session's tasks not yet ended.
const TASK_BYTES_PER_SESSION: usize = 8 << 20;
/// Tasks of one identity not yet ended, over all its sessions.
const TASKS_PER_IDENTITY: usize = 32;
/// Bytes of code of one identity's tasks not yet ended.
const TASK_BYTES_PER_IDENTITY: usize = 32 << 20;

/// Who started a task, and in which form: its requests are answered in that form (a client on
/// a 2025-11-25 connection may use either: rmcp's client starts extension tasks there).
struct Owner {
    /// Whose session it runs in, and the bytes of its code, for the bounds on tasks not ended.
    key: SessionKey,
    legacy: bool,
    bytes: usize,
    /// Set when the task's run ends (result, error, cancel or its TTL).
    ended: Arc<AtomicBool>,
}

/// Sets its flag when dropped: when the task's future ends or is dropped.
struct EndsWith(Arc<AtomicBool>);

impl Drop for EndsWith {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Whether one more task of `bytes` fits beside `owners`' tasks not ended, of `key`'s owner
/// and of its session; `Err` says which bound it would pass.
fn room_for(owners: &HashMap<String, Owner>, key: &SessionKey, bytes: usize) -> Result<(), String> {
    let session = key.name();
    let (mut tasks, mut held, mut session_tasks, mut session_held) = (0, 0, 0, 0);
    for o in owners.values() {
        if o.key.owner() != key.owner() || o.ended.load(Ordering::SeqCst) {
            continue;
        }
        tasks += 1;
        held += o.bytes;
        if o.key == *key {
            session_tasks += 1;
            session_held += o.bytes;
        }
    }
    let mib = |b: usize| format!("{:.1} MiB", b as f64 / (1 << 20) as f64);
    if session_tasks + 1 > TASKS_PER_SESSION || session_held + bytes > TASK_BYTES_PER_SESSION {
        return Err(format!(
            "session {session:?} has {session_tasks} tasks not yet ended, holding {} of code; a session may have {TASKS_PER_SESSION} and {} at once",
            mib(session_held),
            mib(TASK_BYTES_PER_SESSION)
        ));
    }
    if tasks + 1 > TASKS_PER_IDENTITY || held + bytes > TASK_BYTES_PER_IDENTITY {
        return Err(format!(
            "{tasks} tasks of yours have not yet ended, holding {} of code; one client may have {TASKS_PER_IDENTITY} and {} at once",
            mib(held),
            mib(TASK_BYTES_PER_IDENTITY)
        ));
    }
    Ok(())
}

/// `run_python` calls running as tasks, for clients that declared the tasks extension (or
/// that speak 2025-11-25's form), and whose each is. Shared by every connection of a bridge.
#[derive(Clone)]
pub(crate) struct Tasks {
    /// rmcp's: each task's run, status and result.
    manager: TaskManager,
    /// Whose each task is and its form, so one identity cannot read or cancel another's task by
    /// its id. Pruned of the tasks the manager has let go of.
    owners: Arc<Mutex<HashMap<String, Owner>>>,
    /// How long a task may run, and its result then be kept: the longest call and
    /// [`TASK_RETENTION`].
    ttl: Duration,
}

impl Tasks {
    /// No tasks yet; each will live as long as `config`'s longest call allows, and a while.
    pub(crate) fn new(config: &Config) -> Tasks {
        // rmcp fails a task still running at its TTL, and keeps a finished one's result for as
        // long: longer than the longest call, so only results expire (bounded in count by the
        // sessions, in size by the output and image caps). A client's own `ttl` is not taken:
        // a short one would fail a long data job, which is what tasks are for.
        Tasks {
            manager: TaskManager::new(),
            owners: Default::default(),
            ttl: config.max_timeout.0 + TASK_RETENTION,
        }
    }

    /// Whether `identity` may see task `id`: its own, or one that is unknown (the manager
    /// answers those with its own error). Also whether it was started in the 2025-11-25 form.
    fn visible(&self, id: &str, identity: &Identity) -> Result<bool, ErrorData> {
        match self.owners.lock().unwrap().get(id) {
            Some(owner) if owner.key.owner() != identity => {
                Err(ErrorData::invalid_params(format!("no task {id:?}"), None))
            }
            owner => Ok(owner.is_some_and(|o| o.legacy)),
        }
    }

    /// Start `args` as a task (on `calls`) and return its handle. The task ends like a call:
    /// its result is the call's result; a cancel interrupts the code as a client's cancellation
    /// does; and the policy asks, and servers' questions go, through the peer.
    /// Refused when the caller's tasks not yet ended are at a bound (`TASKS_PER_SESSION` and
    /// the others above).
    pub(crate) fn spawn(
        &self,
        calls: &Calls,
        key: SessionKey,
        args: RunArgs,
        context: &RequestContext<RoleServer>,
        legacy: bool,
    ) -> Result<Task, ErrorData> {
        let calls = calls.clone();
        let peer = context.peer.clone();
        let parent = bridge_core::trace::parent_of(&context.meta);
        let owner = key.clone();
        let bytes = args.code.len();
        let ended = Arc::new(AtomicBool::new(false));
        let ends = EndsWith(ended.clone());
        // Held from the count to the record, so two calls at once cannot both take the last place.
        let mut owners = self.owners.lock().unwrap();
        owners.retain(|id, _| self.manager.get_task(id).is_ok());
        if let Err(why) = room_for(&owners, &key, bytes) {
            return Err(refused(
                "tools/call",
                ErrorData::invalid_request(
                    format!(
                        "{why}; wait for one to end (tasks/get) or cancel one (tasks/cancel), then start this one"
                    ),
                    None,
                ),
            ));
        }
        let task = self.manager.spawn(
            TaskOptions::new()
                .with_poll_interval_ms(TASK_POLL_MS)
                .with_ttl_ms(self.ttl.as_millis() as u64),
            move |ctx| {
                Box::pin(async move {
                    let _ends = ends;
                    let cancel = tokio_util::sync::CancellationToken::new();
                    let approver: Arc<dyn Approver> = Arc::new(ClientApprover(peer.clone()));
                    let relay = CallRelay {
                        progress: None,
                        client: Some(Arc::new(PeerLink::new(peer, key.owner().clone()))),
                    };
                    let run = calls.run_for(
                        key,
                        args,
                        cancel.clone(),
                        None,
                        Some(approver),
                        relay,
                        parent,
                    );
                    tokio::pin!(run);
                    tokio::select! {
                        r = &mut run => Ok(r),
                        () = ctx.cancelled() => {
                            // Interrupt the code and let the call end as a cancelled one.
                            cancel.cancel();
                            let _ = run.await;
                            Err(TaskExit::Cancelled)
                        }
                    }
                })
            },
        );
        owners.insert(
            task.task_id.clone(),
            Owner {
                key: owner,
                legacy,
                bytes,
                ended,
            },
        );
        Ok(task)
    }

    /// `tasks/get` of the extension: the caller's own task.
    pub(crate) fn get(&self, id: &str, identity: &Identity) -> Result<GetTaskResult, ErrorData> {
        self.visible(id, identity)?;
        Ok(GetTaskResult::new(self.manager.get_task(id)?))
    }

    /// `tasks/update` of the extension: answers to the caller's own task's questions.
    pub(crate) fn update(
        &self,
        id: &str,
        identity: &Identity,
        responses: InputResponses,
    ) -> Result<(), ErrorData> {
        self.visible(id, identity)?;
        self.manager.update_task(id, responses)
    }

    /// `tasks/cancel` of the extension: the caller's own task interrupted.
    pub(crate) fn cancel(&self, id: &str, identity: &Identity) -> Result<(), ErrorData> {
        self.visible(id, identity)?;
        self.manager.cancel_task(id)
    }

    /// A 2025-11-25 task request, renamed by [`crate::legacy_tasks`]; `None` for any other
    /// custom method. A `tools/call` starts its task on `calls`.
    pub(crate) async fn legacy_request(
        &self,
        calls: &Calls,
        request: &CustomRequest,
        context: &RequestContext<RoleServer>,
    ) -> Option<Result<CustomResult, ErrorData>> {
        let method = request.method.strip_prefix(PREFIX)?;
        let identity = Identity::of_request(&context.extensions);
        let params = request.params.clone().unwrap_or(Value::Null);
        let task_id = || {
            params
                .get("taskId")
                .and_then(Value::as_str)
                .map(str::to_owned)
                .ok_or_else(|| {
                    refused(
                        method,
                        ErrorData::invalid_params(
                            format!("{method} needs params {{\"taskId\": string}}"),
                            None,
                        ),
                    )
                })
        };
        let answer = match method {
            "tools/call" => self.legacy_call(calls, params.clone(), context),
            "tasks/get" => task_id().and_then(|id| {
                let legacy = self.visible(&id, &identity)?;
                let t = self.manager.get_task(&id)?;
                Ok(if legacy {
                    legacy_task(&t.task)
                } else {
                    serde_json::to_value(GetTaskResult::new(t)).unwrap_or_default()
                })
            }),
            "tasks/result" => match task_id() {
                Ok(id) => self.legacy_result(&id, &identity, context).await,
                Err(e) => Err(e),
            },
            "tasks/cancel" => match task_id() {
                Ok(id) => self.legacy_cancel(&id, &identity).await,
                Err(e) => Err(e),
            },
            "tasks/list" => self.legacy_list(&params, &identity),
            _ => return None,
        };
        Some(answer.map(CustomResult::new))
    }

    /// `tools/call` as a 2025-11-25 task: started on `calls`, answered with its handle.
    fn legacy_call(
        &self,
        calls: &Calls,
        params: Value,
        context: &RequestContext<RoleServer>,
    ) -> Result<Value, ErrorData> {
        let request: CallToolRequestParams = serde_json::from_value(params).map_err(|e| {
            refused(
                "tools/call",
                ErrorData::invalid_params(
                    format!("malformed params for \"tools/call\": {e}"),
                    None,
                ),
            )
        })?;
        let (args, key) = call_args(request.name, request.arguments, &context.extensions)?;
        Ok(json!({"task": legacy_task(&self.spawn(calls, key, args, context, true)?)}))
    }

    /// `tasks/result`: wait for the task to end (it does, by its TTL at the latest), then
    /// answer as the call would have: its result, or its error.
    async fn legacy_result(
        &self,
        id: &str,
        identity: &Identity,
        context: &RequestContext<RoleServer>,
    ) -> Result<Value, ErrorData> {
        self.visible(id, identity)?;
        let task = loop {
            let t = self.manager.get_task(id)?;
            if t.task.status.is_terminal() {
                break t;
            }
            tokio::select! {
                () = tokio::time::sleep(RESULT_POLL) => {}
                () = context.ct.cancelled() => {
                    return Err(ErrorData::invalid_request("tasks/result was cancelled", None));
                }
            }
        };
        match task.payload {
            TaskPayload::Completed { mut result } => {
                let meta = result.entry("_meta").or_insert_with(|| json!({}));
                if let Some(meta) = meta.as_object_mut() {
                    meta.insert(RELATED_TASK.into(), json!({"taskId": id}));
                }
                Ok(Value::Object(result))
            }
            TaskPayload::Failed { error } => Err(serde_json::from_value(Value::Object(error))
                .unwrap_or_else(|_| ErrorData::internal_error(format!("task {id} failed"), None))),
            _ => Err(ErrorData::invalid_request(
                format!("task {id} was cancelled; it has no result"),
                None,
            )),
        }
    }

    /// `tasks/cancel`: interrupt the code, and answer with the task once it has stopped (or as
    /// it is after [`CANCEL_WAIT`]).
    async fn legacy_cancel(&self, id: &str, identity: &Identity) -> Result<Value, ErrorData> {
        if !self.visible(id, identity)? {
            // An extension task: its cancel answers at once, with nothing.
            self.manager.cancel_task(id)?;
            return Ok(json!({}));
        }
        if self.manager.get_task(id)?.task.status.is_terminal() {
            return Err(ErrorData::invalid_params(
                format!("task {id} has already ended; only a running task can be cancelled"),
                None,
            ));
        }
        self.manager.cancel_task(id)?;
        let deadline = tokio::time::Instant::now() + CANCEL_WAIT;
        loop {
            let t = self.manager.get_task(id)?;
            if t.task.status.is_terminal() || tokio::time::Instant::now() >= deadline {
                return Ok(legacy_task(&t.task));
            }
            tokio::time::sleep(RESULT_POLL).await;
        }
    }

    /// `tasks/list`: the caller's own tasks, oldest first, a page at a time.
    fn legacy_list(&self, params: &Value, identity: &Identity) -> Result<Value, ErrorData> {
        let start = match params.get("cursor") {
            None | Some(Value::Null) => 0,
            Some(c) => c
                .as_str()
                .and_then(|c| c.parse::<usize>().ok())
                .ok_or_else(|| {
                    ErrorData::invalid_params(
                        format!("unknown cursor {c}; pass the nextCursor of the last page"),
                        None,
                    )
                })?,
        };
        let ids: Vec<String> = self
            .owners
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, owner)| owner.key.owner() == identity)
            .map(|(id, _)| id.clone())
            .collect();
        let mut tasks: Vec<DetailedTask> = ids
            .iter()
            .filter_map(|id| self.manager.get_task(id).ok())
            .collect();
        tasks.sort_by(|a, b| {
            (&a.task.created_at, &a.task.task_id).cmp(&(&b.task.created_at, &b.task.task_id))
        });
        let page: Vec<Value> = tasks
            .iter()
            .skip(start)
            .take(LIST_PAGE)
            .map(|t| legacy_task(&t.task))
            .collect();
        let mut out = json!({"tasks": page});
        if start + LIST_PAGE < tasks.len() {
            out["nextCursor"] = json!((start + LIST_PAGE).to_string());
        }
        Ok(out)
    }
}

/// A task in its 2025-11-25 shape (`ttl` and `pollInterval` where the extension has `ttlMs`
/// and `pollIntervalMs`; no result inlined).
fn legacy_task(t: &Task) -> Value {
    let mut v = json!({
        "taskId": t.task_id,
        "status": t.status,
        "createdAt": t.created_at,
        "lastUpdatedAt": t.last_updated_at,
        "ttl": t.ttl_ms,
    });
    if let Some(p) = t.poll_interval_ms {
        v["pollInterval"] = json!(p);
    }
    if let Some(m) = &t.status_message {
        v["statusMessage"] = json!(m);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::TaskStatus;

    #[test]
    fn tasks_not_ended_are_bounded_per_session_and_per_identity() {
        let key = |who: &str, session: &str| SessionKey::new(Identity::Named(who.into()), session);
        let owner = |who: &str, session: &str, bytes: usize, ended: bool| Owner {
            key: key(who, session),
            legacy: false,
            bytes,
            ended: Arc::new(AtomicBool::new(ended)),
        };
        let mut owners = std::collections::HashMap::new();
        for i in 0..TASKS_PER_SESSION {
            owners.insert(format!("a{i}"), owner("alice", "s", 1, false));
        }
        let why = room_for(&owners, &key("alice", "s"), 1).unwrap_err();
        assert!(why.contains("session \"s\" has 8 tasks"), "{why}");
        assert!(room_for(&owners, &key("alice", "t"), 1).is_ok());
        assert!(room_for(&owners, &key("bob", "s"), 1).is_ok());
        owners.insert("a0".into(), owner("alice", "s", 1, true));
        assert!(room_for(&owners, &key("alice", "s"), 1).is_ok());
        assert!(room_for(&owners, &key("alice", "s"), TASK_BYTES_PER_SESSION).is_err());
        for i in 0..TASKS_PER_IDENTITY {
            owners.insert(format!("b{i}"), owner("alice", &format!("s{i}"), 1, false));
        }
        let why = room_for(&owners, &key("alice", "new"), 1).unwrap_err();
        assert!(why.contains("tasks of yours"), "{why}");
    }

    #[test]
    fn the_2025_11_25_shape() {
        let t = Task::new("t1", TaskStatus::InputRequired, "a", "b")
            .with_ttl_ms(5)
            .with_poll_interval_ms(500);
        assert_eq!(
            legacy_task(&t),
            json!({"taskId": "t1", "status": "input_required", "createdAt": "a",
                "lastUpdatedAt": "b", "ttl": 5, "pollInterval": 500})
        );
        let t = Task::new("t2", TaskStatus::Working, "a", "b");
        assert_eq!(legacy_task(&t)["ttl"], Value::Null);
    }
}
