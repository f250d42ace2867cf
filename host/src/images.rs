//! Where the cluster pulls the images the plugins render: the registry of every image
//! rewritten to a mirror (`--image-registry`), and the Secrets that authenticate the
//! pulls (`--image-pull-secret`). Below `build` and `jobs`, which apply it to every pod
//! they make, before anything is hashed: a change of mirror re-makes the members.

use k8s_openapi::api::core::v1::{LocalObjectReference, PodSpec};

/// How images are pulled. The default changes nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pull {
    /// The registry (with an optional path, `mirror.example:5000/hub`) that serves every image.
    pub registry: Option<String>,
    /// Secrets in the Database's namespace that every pod pulls with.
    pub secrets: Vec<String>,
}

/// The default, for callers that have no settings at hand.
pub static DEFAULT: Pull = Pull { registry: None, secrets: Vec::new() };

impl Pull {
    /// `image` as pulled from the registry: its own registry (the first path component
    /// when it has a `.` or a `:` or is `localhost`; Docker Hub otherwise, whose
    /// single-name images live under `library/`) replaced. One already there is kept.
    pub fn image(&self, image: &str) -> String {
        let Some(registry) = self.registry.as_deref().map(|r| r.trim_end_matches('/')) else { return image.to_string() };
        if image.starts_with(&format!("{registry}/")) {
            return image.to_string();
        }
        let path = match image.split_once('/') {
            Some((first, rest)) if first.contains(['.', ':']) || first == "localhost" => rest.to_string(),
            Some(_) => image.to_string(),
            None => format!("library/{image}"),
        };
        format!("{registry}/{path}")
    }

    /// `pod`'s containers' images pulled from the registry, with the Secrets.
    pub fn pod(&self, pod: &mut PodSpec) {
        for c in pod.containers.iter_mut().chain(pod.init_containers.iter_mut().flatten()) {
            if let Some(image) = &c.image {
                c.image = Some(self.image(image));
            }
        }
        if !self.secrets.is_empty() {
            let secrets = pod.image_pull_secrets.get_or_insert_default();
            secrets.extend(self.secrets.iter().map(|name| LocalObjectReference { name: name.clone() }));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_image_comes_from_the_mirror_under_its_own_path() {
        let mirror = Pull { registry: Some("mirror.example:5000/hub/".into()), secrets: vec![] };
        for (image, pulled) in [
            ("postgres:17", "mirror.example:5000/hub/library/postgres:17"),
            ("docker.io/library/postgres:17", "mirror.example:5000/hub/library/postgres:17"),
            ("plugdb/etcd:3.5", "mirror.example:5000/hub/plugdb/etcd:3.5"),
            ("quay.io/coreos/etcd:v3.5.17", "mirror.example:5000/hub/coreos/etcd:v3.5.17"),
            ("localhost/plugdb:1", "mirror.example:5000/hub/plugdb:1"),
            ("mirror.example:5000/hub/plugdb/plugdb:0.1.0", "mirror.example:5000/hub/plugdb/plugdb:0.1.0"),
        ] {
            assert_eq!(mirror.image(image), pulled, "{image}");
        }
        assert_eq!(DEFAULT.image("postgres:17"), "postgres:17", "no registry: unchanged");
    }
}
