//! Not part of silo's API: the controller's own parts that the workspace's
//! black-box tests, benchmarks, fuzzers and provider mocks drive directly
//! (an engine connection, a provider's client, the store's archive code).
//! Hidden from the docs and free to change with any release; a harness uses
//! the crate root.

pub use crate::agent_binary::{extract_embedded, is_static_executable};
pub use crate::silo::Lease;
pub use crate::state::ScratchSchema;

/// The Docker backend's engine connection, names and labels.
pub mod docker {
    pub use crate::backend::docker::{
        DOCKER, DockerError, LABEL_HOME, LABEL_SANDBOX_ID, LABEL_SANDBOX_NAME, LABEL_SPEC_HASH,
        LONG_REQUEST_TIMEOUT, connect, container_name, engine_host,
    };
}

/// The Podman backend's engine: its flavor and where its socket is.
pub mod podman {
    pub use crate::backend::docker::connect_to;
    pub use crate::backend::podman::{PODMAN, SOCKET_ENV, podman_host};
}

/// E2B's REST API and envd clients, as the benchmarks drive them plainly.
pub mod e2b {
    pub use crate::backend::e2b::api::NewSandbox;
    pub use crate::backend::e2b::{Api, E2bConfig, E2bRef, Envd};
}

/// Daytona's REST API and toolbox clients, as the benchmarks drive them
/// plainly.
pub mod daytona {
    pub use crate::backend::daytona::api::NewSandbox;
    pub use crate::backend::daytona::{Api, DaytonaConfig, Toolbox};
}

/// The Kubernetes backend's settings, as the benchmarks set them.
pub mod kubernetes {
    pub use crate::backend::kubernetes::config::ENV_REACH;
}

/// Image builds on an engine connection of the caller's.
pub mod image {
    pub use crate::image::{
        BAKED_AGENT_PATH, BASE_ID_LABEL, BASE_ID_PATH, BASE_LAYERS_LABEL, BakeRequest, Context,
        bake, build, build_base, exists,
    };
}

/// One push to one agent, without a sandbox.
pub mod push {
    pub use crate::push::{RetryPolicy, SharedBundle, files_from_dir, push_to_sandbox};
}

/// The content-addressed store and the engine's image archives.
pub mod store {
    pub use crate::store::{Index, LayerDelta, LoadPlan, Store, load_archive, save_archive};
}
