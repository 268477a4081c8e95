//! Pause and resume, as the API runs them for a VM sandbox (`linux-vm`;
//! a container is refused with `422`): `POST /sandbox/{idOrName}/pause`
//! answers at once with the sandbox `pausing` and the runner freezes it
//! (here `docker pause`: memory and processes kept), then it is `paused`;
//! `POST /sandbox/{idOrName}/start` on a paused sandbox shows `resuming`
//! and answers once it runs again, its processes where they were and its
//! preview token unchanged (a start from `stopped` makes a new one).

use std::sync::Arc;

use http::StatusCode;

use super::{Desired, Record, Refusal, SandboxClass, State, Store, find_in_mut};

/// The API's refusal of a pause or resume (`what`) of a sandbox that is
/// not a VM.
pub fn check_class(record: &Record, what: &str) -> Result<(), Refusal> {
    match record.sandbox_class {
        SandboxClass::LinuxVm => Ok(()),
        SandboxClass::Container => Err(Refusal::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("{what} is not supported for this sandbox"),
        )),
    }
}

impl Store {
    /// Pauses a started VM sandbox; answers at once with it `pausing`.
    pub fn pause(self: &Arc<Self>, id_or_name: &str) -> Result<Record, Refusal> {
        let mut records = self.lock();
        let record =
            find_in_mut(&mut records, id_or_name).ok_or_else(|| Refusal::not_found(id_or_name))?;
        // The API marks the state column `pausing` at once: a pause under
        // way is not `started` any more.
        if record.state != State::Started || record.desired == Desired::Paused {
            return Err(Refusal::bad("Sandbox must be in started state to pause"));
        }
        if record.pending {
            return Err(Refusal::in_progress());
        }
        check_class(record, "Pausing")?;
        record.desired = Desired::Paused;
        record.pending = true;
        record.updated_at = std::time::SystemTime::now();
        let answer = record.clone();
        drop(records);
        let store = self.clone();
        let (id, container) = (answer.id.clone(), answer.container.clone());
        tokio::spawn(async move {
            match container.pause().await {
                Ok(()) => {
                    store.finish(&id, |r| {
                        r.state = State::Paused;
                        r.pending = false;
                    });
                }
                Err(error) => store.fail(&id, &error),
            }
        });
        Ok(answer)
    }
}
