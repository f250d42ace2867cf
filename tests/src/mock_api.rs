//! A mocked API client for unit-speed tests of whole passes: every request the operator
//! makes is recorded in order, and answered as the API server answers a request that
//! succeeds, from the request itself: a create or an apply returns what was sent (a
//! create of an object it holds is refused as the API server refuses it), a
//! patch of the Database returns the Database with the patch applied, a delete returns
//! success, a read finds what the test said the API server holds ([`MockApi::serving`])
//! or nothing; a write the test says the API server refuses ([`MockApi::refusing`]) is
//! refused. Nothing is kept between requests but the Database.
//!
//! This is not a control plane: what a pass writes is checked here, what the API
//! server and the nodes make of it is checked by the real tiers.

use std::sync::{Arc, Mutex};

use http::{Method, Request, Response, StatusCode};
use kube::client::Body;
use serde_json::{Value, json};

/// One request the operator made.
#[derive(Debug, Clone)]
pub struct Call {
    /// `GET`, `POST`, `PATCH`, `DELETE`, ...
    pub method: Method,
    /// The path, without the query.
    pub path: String,
    /// The query (`fieldManager=plugdb&force=true`), empty when none.
    pub query: String,
    /// The body as JSON (`Null` when empty).
    pub body: Value,
}

impl Call {
    /// `PATCH /api/v1/namespaces/shop/secrets/orders`: what a test compares.
    pub fn line(&self) -> String {
        format!("{} {}", self.method, self.path)
    }

    /// Whether the request is a server-side apply.
    pub fn is_apply(&self) -> bool {
        self.method == Method::PATCH && self.query.contains("fieldManager") && self.body.get("apiVersion").is_some()
    }
}

/// The API server as a pass sees it: `database` (as JSON) is the one object it keeps.
#[derive(Clone)]
pub struct MockApi {
    calls: Arc<Mutex<Vec<Call>>>,
    database: Arc<Mutex<Value>>,
    served: Arc<Vec<(String, Value)>>,
    refused: Arc<Vec<(String, u16)>>,
}

impl MockApi {
    /// A mock whose Database is `database`.
    pub fn new(database: &plugdb::crd::Database) -> Self {
        let database = serde_json::to_value(database).expect("a Database is JSON");
        Self { calls: Arc::default(), database: Arc::new(Mutex::new(database)), served: Arc::default(), refused: Arc::default() }
    }

    /// The same mock, answering a read of each path of `served` with its object.
    pub fn serving(mut self, served: &[(String, Value)]) -> Self {
        self.served = Arc::new(served.to_vec());
        self
    }

    /// The same mock, refusing a write (not a read) of each path of `refused` with its
    /// status code (`422`: the object is invalid).
    pub fn refusing(mut self, refused: &[(String, u16)]) -> Self {
        self.refused = Arc::new(refused.to_vec());
        self
    }

    /// A client whose every request this mock answers.
    pub fn client(&self) -> kube::Client {
        let mock = self.clone();
        let service = tower::service_fn(move |request: Request<Body>| {
            let mock = mock.clone();
            async move { Ok::<_, std::convert::Infallible>(mock.answer(request).await) }
        });
        kube::Client::new(service, "default")
    }

    /// The requests so far, in order; they are forgotten.
    pub fn take(&self) -> Vec<Call> {
        std::mem::take(&mut *self.calls.lock().expect("calls"))
    }

    /// The Database as the requests so far left it.
    pub fn database(&self) -> plugdb::crd::Database {
        serde_json::from_value(self.database.lock().expect("database").clone()).expect("the Database")
    }

    /// Whether a read of `path` finds an object.
    fn serves(&self, path: &str) -> bool {
        self.served.iter().any(|(served, _)| served == path)
    }

    async fn answer(&self, request: Request<Body>) -> Response<Body> {
        use http_body_util::BodyExt;
        let (parts, body) = request.into_parts();
        let bytes = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
        let body: Value = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).or_else(|_| yaml_serde::from_slice(&bytes)).unwrap_or(Value::Null)
        };
        let content_type = parts.headers.get(http::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
        let call = Call {
            method: parts.method.clone(),
            path: parts.uri.path().to_string(),
            query: parts.uri.query().unwrap_or_default().to_string(),
            body: body.clone(),
        };
        self.calls.lock().expect("calls").push(call.clone());
        let refusal = self.refused.iter().find(|(path, _)| *path == call.path).map(|(_, code)| *code);
        let (status, answer) = match (parts.method, refusal) {
            (Method::GET, _) => match self.served.iter().find(|(path, _)| *path == call.path) {
                Some((_, object)) => (StatusCode::OK, object.clone()),
                None => (StatusCode::NOT_FOUND, status(404, "NotFound")),
            },
            (_, Some(code)) => {
                let mut refusal = status(code, "Invalid");
                refusal["message"] = json!("refused as the test asked");
                (StatusCode::from_u16(code).expect("a status code"), refusal)
            }
            (Method::DELETE, _) => (StatusCode::OK, status(200, "Success")),
            (Method::POST, _) if self.serves(&format!("{}/{}", call.path, body["metadata"]["name"].as_str().unwrap_or_default())) => {
                (StatusCode::CONFLICT, status(409, "AlreadyExists"))
            }
            (Method::POST, _) => (StatusCode::CREATED, stored(body)),
            (Method::PATCH, _) if call.path.contains("/databases/") => (StatusCode::OK, self.patch_database(&content_type, body)),
            (Method::PATCH, _) if call.is_apply() => (StatusCode::OK, stored(body)),
            (Method::PATCH, _) => (StatusCode::OK, named(&call.path)),
            _ => (StatusCode::METHOD_NOT_ALLOWED, status(405, "MethodNotAllowed")),
        };
        let mut response = Response::new(Body::from(serde_json::to_vec(&answer).expect("JSON")));
        *response.status_mut() = status;
        response
    }

    fn patch_database(&self, content_type: &str, patch: Value) -> Value {
        let mut database = self.database.lock().expect("database");
        if content_type.contains("json-patch") {
            let patch: json_patch::Patch = serde_json::from_value(patch).expect("a JSON Patch");
            json_patch::patch(&mut database, &patch).expect("the JSON Patch applies");
        } else {
            json_patch::merge(&mut database, &patch);
        }
        let version = database["metadata"]["resourceVersion"].as_str().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        database["metadata"]["resourceVersion"] = json!((version + 1).to_string());
        database.clone()
    }
}

/// What the API server returns for a created or applied object: the object, with a
/// version and a generation no controller has observed yet (a pass applies only what
/// changed).
fn stored(mut object: Value) -> Value {
    if object.is_object() {
        object["metadata"]["resourceVersion"] = json!("1");
        object["metadata"]["generation"] = json!(1);
    }
    object
}

/// An object named by the last segment of `path`, for a patch whose answer a pass reads
/// nothing of.
fn named(path: &str) -> Value {
    json!({"metadata": {"name": path.rsplit('/').next().unwrap_or_default()}})
}

fn status(code: u16, reason: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": if code < 400 { "Success" } else { "Failure" }, "reason": reason, "code": code})
}
