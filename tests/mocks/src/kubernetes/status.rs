//! The API's answers that are not objects: `Status` bodies (kind `Status`,
//! `status: Failure`, a `reason`, the HTTP `code`, `details` naming the
//! object) for every refusal, with the messages the API server writes, and
//! the JSON answer of an object.

use http::{Response, StatusCode};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Status, StatusCause, StatusDetails};

use crate::http::{Body, json};

/// What an object is called in messages: its kind (`Pod`), its resource
/// (`pods`) and its API group (empty for the core group).
#[derive(Debug, Clone, Copy)]
pub struct Kind {
    /// The kind, as in `kind:`.
    pub kind: &'static str,
    /// The resource, as in the URL.
    pub resource: &'static str,
    /// The API group.
    pub group: &'static str,
}

impl Kind {
    /// The resource qualified by its group (`networkpolicies.networking.k8s.io`),
    /// as messages name it.
    fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.resource.to_owned()
        } else {
            format!("{}.{}", self.resource, self.group)
        }
    }

    fn details(&self, name: &str) -> StatusDetails {
        StatusDetails {
            name: Some(name.to_owned()),
            group: (!self.group.is_empty()).then(|| self.group.to_owned()),
            kind: Some(self.resource.to_owned()),
            ..Default::default()
        }
    }
}

/// A problem with one field of an object, as the API reports it in a `422`.
#[derive(Debug, Clone)]
pub struct FieldProblem {
    /// The field's path (`spec.containers[0].env[1].valueFrom`).
    pub field: String,
    /// `FieldValueRequired`, `FieldValueInvalid`, `FieldValueForbidden`,
    /// `FieldValueNotFound`, `FieldValueNotSupported`.
    pub reason: &'static str,
    /// What is wrong, as it follows the field in the message.
    pub detail: String,
}

impl FieldProblem {
    /// A required field left out.
    pub fn required(field: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            reason: "FieldValueRequired",
            detail: "Required value".to_owned(),
        }
    }

    /// A value the API refuses.
    pub fn invalid(field: impl Into<String>, value: &str, why: &str) -> Self {
        Self {
            field: field.into(),
            reason: "FieldValueInvalid",
            detail: format!("Invalid value: {value:?}: {why}"),
        }
    }

    /// A field that may not be set (here: one the mock does not model).
    pub fn forbidden(field: impl Into<String>, why: &str) -> Self {
        Self {
            field: field.into(),
            reason: "FieldValueForbidden",
            detail: format!("Forbidden: {why}"),
        }
    }

    /// A reference to something that is not there.
    pub fn not_found(field: impl Into<String>, value: &str) -> Self {
        Self {
            field: field.into(),
            reason: "FieldValueNotFound",
            detail: format!("Not found: {value:?}"),
        }
    }

    /// A value outside the supported set.
    pub fn not_supported(field: impl Into<String>, value: &str, supported: &[&str]) -> Self {
        let quoted: Vec<String> = supported.iter().map(|s| format!("{s:?}")).collect();
        Self {
            field: field.into(),
            reason: "FieldValueNotSupported",
            detail: format!(
                "Unsupported value: {value:?}: supported values: {}",
                quoted.join(", ")
            ),
        }
    }
}

/// A `Status` answer with `code`, `reason` and `message`.
pub fn failure(
    code: StatusCode,
    reason: &str,
    message: String,
    details: Option<StatusDetails>,
) -> Response<Body> {
    let status = Status {
        code: Some(i32::from(code.as_u16())),
        details,
        message: Some(message),
        reason: (!reason.is_empty()).then(|| reason.to_owned()),
        status: Some("Failure".to_owned()),
        ..Default::default()
    };
    json(code, &status)
}

/// `404` for an object that is not there: `pods "x" not found`.
pub fn not_found(kind: &Kind, name: &str) -> Response<Body> {
    failure(
        StatusCode::NOT_FOUND,
        "NotFound",
        format!("{} {name:?} not found", kind.qualified()),
        Some(kind.details(name)),
    )
}

/// `404` for a path the API does not serve.
pub fn no_such_path() -> Response<Body> {
    failure(
        StatusCode::NOT_FOUND,
        "NotFound",
        "the server could not find the requested resource".to_owned(),
        Some(StatusDetails::default()),
    )
}

/// `409` for a create whose name is taken: `pods "x" already exists`.
pub fn already_exists(kind: &Kind, name: &str) -> Response<Body> {
    failure(
        StatusCode::CONFLICT,
        "AlreadyExists",
        format!("{} {name:?} already exists", kind.qualified()),
        Some(kind.details(name)),
    )
}

/// `422` for an object the API refuses: `Pod "x" is invalid: …`.
pub fn invalid(kind: &Kind, name: &str, problems: &[FieldProblem]) -> Response<Body> {
    let listed: Vec<String> = problems
        .iter()
        .map(|p| format!("{}: {}", p.field, p.detail))
        .collect();
    let message = if listed.len() == 1 {
        format!("{} {name:?} is invalid: {}", kind.kind, listed.join(""))
    } else {
        format!("{} {name:?} is invalid: [{}]", kind.kind, listed.join(", "))
    };
    let causes = problems
        .iter()
        .map(|p| StatusCause {
            field: Some(p.field.clone()),
            message: Some(p.detail.clone()),
            reason: Some(p.reason.to_owned()),
        })
        .collect();
    let details = StatusDetails {
        name: Some(name.to_owned()),
        group: (!kind.group.is_empty()).then(|| kind.group.to_owned()),
        kind: Some(kind.kind.to_owned()),
        causes: Some(causes),
        ..Default::default()
    };
    failure(
        StatusCode::UNPROCESSABLE_ENTITY,
        "Invalid",
        message,
        Some(details),
    )
}

/// `400` with `message`.
pub fn bad_request(message: impl Into<String>) -> Response<Body> {
    failure(StatusCode::BAD_REQUEST, "BadRequest", message.into(), None)
}

/// `401` for a request without the bearer token.
pub fn unauthorized() -> Response<Body> {
    failure(
        StatusCode::UNAUTHORIZED,
        "Unauthorized",
        "Unauthorized".to_owned(),
        None,
    )
}

/// `405` for a verb the resource does not serve.
pub fn method_not_allowed() -> Response<Body> {
    failure(
        StatusCode::METHOD_NOT_ALLOWED,
        "MethodNotAllowed",
        "the server does not allow this method on the requested resource".to_owned(),
        Some(StatusDetails::default()),
    )
}

/// `410`: a watch from a resource version older than the mock keeps.
pub fn expired(asked: u64, oldest: u64) -> Status {
    Status {
        code: Some(410),
        message: Some(format!("too old resource version: {asked} ({oldest})")),
        reason: Some("Expired".to_owned()),
        status: Some("Failure".to_owned()),
        ..Default::default()
    }
}

/// `500` for what the mock itself failed at (the engine, the disk).
pub fn internal(message: impl Into<String>) -> Response<Body> {
    let message = message.into();
    let details = StatusDetails {
        causes: Some(vec![StatusCause {
            message: Some(message.clone()),
            ..Default::default()
        }]),
        ..Default::default()
    };
    failure(
        StatusCode::INTERNAL_SERVER_ERROR,
        "InternalError",
        format!("Internal error occurred: {message}"),
        Some(details),
    )
}

/// An object as the API answers it.
pub fn object<T: serde::Serialize>(code: StatusCode, value: &T) -> Response<Body> {
    json(code, value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    const PODS: Kind = Kind {
        kind: "Pod",
        resource: "pods",
        group: "",
    };
    const POLICIES: Kind = Kind {
        kind: "NetworkPolicy",
        resource: "networkpolicies",
        group: "networking.k8s.io",
    };

    async fn body(response: Response<Body>) -> serde_json::Value {
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        serde_json::from_slice(&bytes).unwrap()
    }

    #[tokio::test]
    async fn not_found_names_the_resource() {
        let answer = not_found(&PODS, "web");
        assert_eq!(answer.status(), StatusCode::NOT_FOUND);
        assert_eq!(
            body(answer).await,
            serde_json::json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {},
                "status": "Failure", "message": "pods \"web\" not found",
                "reason": "NotFound", "details": {"name": "web", "kind": "pods"},
                "code": 404,
            })
        );
        let answer = body(not_found(&POLICIES, "deny")).await;
        assert_eq!(
            answer["message"],
            "networkpolicies.networking.k8s.io \"deny\" not found"
        );
        assert_eq!(answer["details"]["group"], "networking.k8s.io");
    }

    #[tokio::test]
    async fn invalid_lists_the_causes() {
        let answer = invalid(&PODS, "web", &[FieldProblem::required("spec.containers")]);
        assert_eq!(answer.status(), StatusCode::UNPROCESSABLE_ENTITY);
        let answer = body(answer).await;
        assert_eq!(
            answer["message"],
            "Pod \"web\" is invalid: spec.containers: Required value"
        );
        assert_eq!(answer["details"]["kind"], "Pod");
        assert_eq!(
            answer["details"]["causes"][0]["reason"],
            "FieldValueRequired"
        );
    }
}
