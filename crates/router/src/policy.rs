//! Router policy classes: Dynamo's `--router-policy-config` YAML.
//!
//! A policy profile splits the router's pending queue into named classes. Each class has its own
//! order (fcfs or wspt), its own idea of when every target is busy (an absolute
//! `prefill_busy_threshold` in tokens and/or `prefill_busy_threshold_frac` of
//! `max_num_batched_tokens`), its own queue limits (per eligible target), and a `quantum`: the
//! classes share the release slots by deficit round robin, a class earning `quantum` prompt tokens
//! of credit per round and spending a request's uncached prompt tokens when it is released.
//!
//! A request goes to the class its `policy_class` names exactly; otherwise its `policy_class` is
//! read as a policy family (the profile's `default_policy_family` when it is missing or unknown)
//! and the class is the one bound to that family and to the request's uncached-prompt bucket
//! (`isl − the longest cached prefix over eligible targets × block size`, bucketed by the highest
//! `min_tokens` not above it). A profile under `models:` named by `--model-name` replaces the root
//! profile entirely; without either, the router has one synthetic class made from
//! `router_queue_threshold` and `router_queue_policy` (the queue it always had).

use std::collections::HashMap;

use serde::Deserialize;

use crate::queue_policy::QueuePolicy;

/// One physical queue of the router.
#[derive(Clone, Debug, PartialEq)]
pub struct PolicyClass {
    pub name: String,
    pub queue_policy: QueuePolicy,
    /// Prompt tokens of release credit per deficit-round-robin round (≥ 1).
    pub quantum: u64,
    /// A target is busy for this class above this many pending prefill tokens.
    pub prefill_busy_threshold: Option<u64>,
    /// ... or above this fraction of its `max_num_batched_tokens`.
    pub prefill_busy_threshold_frac: Option<f64>,
    /// Queue limits, each times the number of eligible targets: a request arriving when the
    /// class already holds that many is refused (Dynamo stops the replay).
    pub request_queue_limit_per_worker: Option<u64>,
    pub raw_isl_token_queue_limit_per_worker: Option<u64>,
    pub cached_token_queue_limit_per_worker: Option<u64>,
}

impl PolicyClass {
    /// Whether requests of this class ever wait (some busy threshold is set).
    pub fn queueing(&self) -> bool {
        self.prefill_busy_threshold.is_some() || self.prefill_busy_threshold_frac.is_some()
    }

    /// Whether a target with `pending_tokens` of prefill ahead is busy for this class.
    pub fn busy(&self, pending_tokens: u64, max_num_batched_tokens: u32) -> bool {
        self.prefill_busy_threshold.is_some_and(|t| pending_tokens > t)
            || self
                .prefill_busy_threshold_frac
                .is_some_and(|f| pending_tokens as f64 > f * max_num_batched_tokens as f64)
    }
}

#[derive(Clone, Debug, PartialEq)]
enum Classifier {
    /// Everything goes to class 0.
    Single,
    FamilyBucket {
        default_family: usize,
        families: HashMap<String, usize>,
        /// Classes bound to no family: reached only by naming them.
        explicit: HashMap<String, usize>,
        /// `min_tokens` of each bucket, strictly increasing from 0.
        bucket_min_tokens: Vec<u64>,
        /// Class index of (family, bucket), row-major by family.
        table: Vec<usize>,
    },
}

/// The classes of one profile and how requests are sorted into them.
#[derive(Clone, Debug, PartialEq)]
pub struct PolicyProfile {
    classes: Vec<PolicyClass>,
    classifier: Classifier,
}

impl PolicyProfile {
    /// The one-class profile a router without a policy configuration has.
    pub fn synthetic(queue_threshold: Option<f64>, queue_policy: QueuePolicy) -> Self {
        PolicyProfile {
            classes: vec![PolicyClass {
                name: "default".into(),
                queue_policy,
                quantum: 1,
                prefill_busy_threshold: None,
                prefill_busy_threshold_frac: queue_threshold,
                request_queue_limit_per_worker: None,
                raw_isl_token_queue_limit_per_worker: None,
                cached_token_queue_limit_per_worker: None,
            }],
            classifier: Classifier::Single,
        }
    }

    pub fn classes(&self) -> &[PolicyClass] {
        &self.classes
    }

    pub fn class(&self, index: usize) -> &PolicyClass {
        &self.classes[index]
    }

    /// Whether any class ever queues.
    pub fn queueing(&self) -> bool {
        self.classes.iter().any(PolicyClass::queueing)
    }

    /// The class a request goes to without looking at the caches: the only class of a
    /// one-class profile, or the class `requested` names exactly.
    pub fn direct(&self, requested: Option<&str>) -> Option<usize> {
        match &self.classifier {
            Classifier::Single => Some(0),
            Classifier::FamilyBucket { explicit, .. } => requested.and_then(|name| explicit.get(name).copied()),
        }
    }

    /// The class of a request asking for `requested` whose uncached prompt is `uncached_tokens`.
    pub fn resolve(&self, requested: Option<&str>, uncached_tokens: u64) -> usize {
        if let Some(class) = self.direct(requested) {
            return class;
        }
        let Classifier::FamilyBucket { default_family, families, bucket_min_tokens, table, .. } = &self.classifier
        else {
            unreachable!("a one-class profile resolves directly")
        };
        let family = requested.and_then(|name| families.get(name).copied()).unwrap_or(*default_family);
        let bucket = bucket_min_tokens.partition_point(|&min| min <= uncached_tokens).saturating_sub(1);
        table[family * bucket_min_tokens.len() + bucket]
    }
}

/// A parsed `--router-policy-config` document: a root profile and/or per-model profiles.
#[derive(Clone, Debug, PartialEq)]
pub struct PolicyConfig {
    root: Option<PolicyProfile>,
    models: HashMap<String, PolicyProfile>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDocument {
    default_policy_family: Option<String>,
    uncached_isl_buckets: Option<Vec<RawBucket>>,
    policy_classes: Option<Vec<RawClass>>,
    #[serde(default)]
    models: Option<std::collections::BTreeMap<String, RawProfile>>,
    /// Dynamo's other sections, refused by name below (not modelled).
    router: Option<serde::de::IgnoredAny>,
    request_classifier: Option<serde::de::IgnoredAny>,
    worker_selection: Option<serde::de::IgnoredAny>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProfile {
    default_policy_family: String,
    uncached_isl_buckets: Vec<RawBucket>,
    policy_classes: Vec<RawClass>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBucket {
    min_tokens: u64,
    bucket: String,
}

#[derive(Deserialize, Clone, Copy)]
#[serde(rename_all = "lowercase")]
enum RawQueuePolicy {
    Fcfs,
    Wspt,
    Lcfs,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawClass {
    name: String,
    policy_family: Option<String>,
    cache_bucket: Option<String>,
    queue_policy: Option<RawQueuePolicy>,
    quantum: u64,
    prefill_busy_threshold: Option<u64>,
    prefill_busy_threshold_frac: Option<f64>,
    request_queue_limit_per_worker: Option<u64>,
    raw_isl_token_queue_limit_per_worker: Option<u64>,
    cached_token_queue_limit_per_worker: Option<u64>,
}

/// A configuration error: the key path it is about (`policy_classes[1].quantum`, empty for the
/// whole document) and what is wrong.
#[derive(Clone, Debug, PartialEq)]
pub struct PolicyError {
    pub path: String,
    pub message: String,
}

impl std::fmt::Display for PolicyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.path.is_empty() {
            write!(f, "{}", self.message)
        } else {
            write!(f, "`{}`: {}", self.path, self.message)
        }
    }
}

fn err(path: impl Into<String>, message: impl Into<String>) -> PolicyError {
    PolicyError { path: path.into(), message: message.into() }
}

/// Names are Dynamo's identifiers: `[A-Za-z0-9_.-]+`.
fn identifier(path: String, name: &str) -> Result<(), PolicyError> {
    if !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-')) {
        Ok(())
    } else {
        Err(err(path, format!("{name:?} must match [A-Za-z0-9_.-]+")))
    }
}

/// The deepest nesting a policy configuration may have (it needs four levels).
const MAX_DEPTH: usize = 64;

impl PolicyConfig {
    /// Reads and checks a policy configuration's YAML text (the caller reads the file: this
    /// crate does no I/O); errors name the key path.
    pub fn from_yaml(text: &str) -> Result<Self, PolicyError> {
        // Parsing is quadratic in the nesting depth: a 200 KB file of brackets took 39 s.
        if let Err(deep) = crate::yaml_scan::scan(text, MAX_DEPTH) {
            return Err(err("", format!("line {}: lists and mappings nest deeper than {MAX_DEPTH} levels", deep.line)));
        }
        let raw: RawDocument = serde_yaml_ng::from_str(text).map_err(|e| {
            // serde_yaml_ng prefixes the key path ("policy_classes[0]: unknown field ...").
            let message = e.to_string();
            match message.split_once(": ") {
                Some((path, rest)) if !path.contains(' ') => err(path, rest),
                _ => err("", message),
            }
        })?;
        for (key, present) in [
            ("router", raw.router.is_some()),
            ("request_classifier", raw.request_classifier.is_some()),
            ("worker_selection", raw.worker_selection.is_some()),
        ] {
            if present {
                return Err(err(key, "is not supported by servesim (only queue policy profiles are modelled)"));
            }
        }
        let root = match (raw.default_policy_family, raw.uncached_isl_buckets, raw.policy_classes) {
            (None, None, None) => None,
            (Some(family), Some(buckets), Some(classes)) => Some(build_profile(
                RawProfile { default_policy_family: family, uncached_isl_buckets: buckets, policy_classes: classes },
                "",
            )?),
            _ => {
                return Err(err(
                    "",
                    "the root profile needs default_policy_family, uncached_isl_buckets and policy_classes together",
                ))
            }
        };
        let mut models = HashMap::new();
        for (name, profile) in raw.models.unwrap_or_default() {
            if name.is_empty() {
                return Err(err("models", "a model profile name must not be empty"));
            }
            let profile = build_profile(profile, &format!("models.{name}."))?;
            models.insert(name, profile);
        }
        if root.is_none() && models.is_empty() {
            return Err(err("", "a router policy config needs a root profile or at least one model profile"));
        }
        Ok(PolicyConfig { root, models })
    }

    /// The profile for `model_name`: its own profile, else the root one, else None (the router
    /// then builds the synthetic one from `router_queue_threshold` / `router_queue_policy`).
    pub fn profile(&self, model_name: Option<&str>) -> Option<&PolicyProfile> {
        model_name.and_then(|m| self.models.get(m)).or(self.root.as_ref())
    }
}

fn build_profile(raw: RawProfile, prefix: &str) -> Result<PolicyProfile, PolicyError> {
    identifier(format!("{prefix}default_policy_family"), &raw.default_policy_family)?;
    if raw.policy_classes.is_empty() {
        return Err(err(format!("{prefix}policy_classes"), "must not be empty"));
    }
    let buckets_path = format!("{prefix}uncached_isl_buckets");
    if raw.uncached_isl_buckets.is_empty() {
        return Err(err(buckets_path, "must not be empty"));
    }
    if raw.uncached_isl_buckets[0].min_tokens != 0 {
        return Err(err(format!("{buckets_path}[0].min_tokens"), "the first bucket must start at min_tokens 0"));
    }
    let mut bucket_index = HashMap::new();
    let mut bucket_names = Vec::new();
    let mut bucket_min_tokens = Vec::new();
    for (i, b) in raw.uncached_isl_buckets.iter().enumerate() {
        if i > 0 && b.min_tokens <= bucket_min_tokens[i - 1] {
            return Err(err(format!("{buckets_path}[{i}].min_tokens"), "min_tokens must be strictly increasing"));
        }
        identifier(format!("{buckets_path}[{i}].bucket"), &b.bucket)?;
        if bucket_index.insert(b.bucket.clone(), i).is_some() {
            return Err(err(format!("{buckets_path}[{i}].bucket"), format!("duplicate cache bucket {:?}", b.bucket)));
        }
        bucket_names.push(b.bucket.clone());
        bucket_min_tokens.push(b.min_tokens);
    }

    let mut classes = Vec::new();
    // (family, bucket) of each class bound to one; None for explicit classes.
    let mut bindings: Vec<Option<(String, usize)>> = Vec::new();
    let mut names = HashMap::new();
    for (i, c) in raw.policy_classes.into_iter().enumerate() {
        let at = |key: &str| format!("{prefix}policy_classes[{i}].{key}");
        identifier(at("name"), &c.name)?;
        if names.insert(c.name.clone(), i).is_some() {
            return Err(err(at("name"), format!("duplicate policy class {:?}", c.name)));
        }
        if c.quantum == 0 {
            return Err(err(at("quantum"), "must be greater than zero"));
        }
        let queue_policy = match c.queue_policy.unwrap_or(RawQueuePolicy::Fcfs) {
            RawQueuePolicy::Fcfs => QueuePolicy::Fcfs,
            RawQueuePolicy::Wspt => QueuePolicy::Wspt,
            RawQueuePolicy::Lcfs => return Err(err(at("queue_policy"), "must be fcfs or wspt in a policy class")),
        };
        if c.prefill_busy_threshold_frac.is_some_and(|f| !f.is_finite() || f < 0.0) {
            return Err(err(at("prefill_busy_threshold_frac"), "must be finite and non-negative"));
        }
        let binding = match (c.policy_family, c.cache_bucket) {
            (None, None) => None,
            (Some(family), Some(bucket)) => {
                identifier(at("policy_family"), &family)?;
                identifier(at("cache_bucket"), &bucket)?;
                let Some(&b) = bucket_index.get(&bucket) else {
                    return Err(err(at("cache_bucket"), format!("unknown cache bucket {bucket:?}")));
                };
                Some((family, b))
            }
            _ => {
                return Err(err(
                    format!("{prefix}policy_classes[{i}]"),
                    "give both policy_family and cache_bucket, or neither for an explicit class",
                ))
            }
        };
        bindings.push(binding);
        classes.push(PolicyClass {
            name: c.name,
            queue_policy,
            quantum: c.quantum,
            prefill_busy_threshold: c.prefill_busy_threshold,
            prefill_busy_threshold_frac: c.prefill_busy_threshold_frac,
            request_queue_limit_per_worker: c.request_queue_limit_per_worker,
            raw_isl_token_queue_limit_per_worker: c.raw_isl_token_queue_limit_per_worker,
            cached_token_queue_limit_per_worker: c.cached_token_queue_limit_per_worker,
        });
    }

    // Families in the order their first class appears.
    let mut families: HashMap<String, usize> = HashMap::new();
    let mut family_names: Vec<String> = Vec::new();
    for (family, _) in bindings.iter().flatten() {
        if !families.contains_key(family) {
            families.insert(family.clone(), family_names.len());
            family_names.push(family.clone());
        }
    }
    let Some(&default_family) = families.get(&raw.default_policy_family) else {
        return Err(err(
            format!("{prefix}default_policy_family"),
            format!("{:?} is not the policy_family of any class", raw.default_policy_family),
        ));
    };
    let n_buckets = bucket_min_tokens.len();
    let mut table: Vec<Option<usize>> = vec![None; family_names.len() * n_buckets];
    let mut explicit = HashMap::new();
    for (i, binding) in bindings.iter().enumerate() {
        match binding {
            None => {
                if families.contains_key(&classes[i].name) {
                    return Err(err(
                        format!("{prefix}policy_classes[{i}].name"),
                        format!("explicit policy class {:?} has the name of a policy family", classes[i].name),
                    ));
                }
                explicit.insert(classes[i].name.clone(), i);
            }
            Some((family, b)) => {
                let slot = families[family] * n_buckets + b;
                if table[slot].replace(i).is_some() {
                    return Err(err(
                        format!("{prefix}policy_classes[{i}]"),
                        format!("a second class for family {family:?} and bucket {:?}", bucket_names[*b]),
                    ));
                }
            }
        }
    }
    for (f, family) in family_names.iter().enumerate() {
        for (b, bucket) in bucket_names.iter().enumerate() {
            if table[f * n_buckets + b].is_none() {
                return Err(err(
                    format!("{prefix}policy_classes"),
                    format!("no class for family {family:?} and bucket {bucket:?} (every family needs every bucket)"),
                ));
            }
        }
    }
    Ok(PolicyProfile {
        classes,
        classifier: Classifier::FamilyBucket {
            default_family,
            families,
            explicit,
            bucket_min_tokens,
            table: table.into_iter().map(|c| c.expect("checked above")).collect(),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = r#"
default_policy_family: standard
uncached_isl_buckets:
  - {min_tokens: 0, bucket: cached}
  - {min_tokens: 32, bucket: uncached}
policy_classes:
  - {name: std_cached, policy_family: standard, cache_bucket: cached, quantum: 1}
  - {name: std_uncached, policy_family: standard, cache_bucket: uncached, quantum: 2, queue_policy: wspt}
  - {name: lat_cached, policy_family: latency, cache_bucket: cached, quantum: 3, prefill_busy_threshold: 0}
  - {name: lat_uncached, policy_family: latency, cache_bucket: uncached, quantum: 4,
     prefill_busy_threshold_frac: 0.5, request_queue_limit_per_worker: 1}
  - {name: vip, quantum: 8}
models:
  small:
    default_policy_family: only
    uncached_isl_buckets: [{min_tokens: 0, bucket: all}]
    policy_classes: [{name: only_all, policy_family: only, cache_bucket: all, quantum: 5}]
"#;

    fn error(yaml: &str) -> PolicyError {
        PolicyConfig::from_yaml(yaml).expect_err("accepted a bad config")
    }

    #[test]
    fn deep_nesting_is_refused_before_parsing() {
        // Audit N12: 50,000 levels took 6.3 s of parsing before this check.
        let started = std::time::Instant::now();
        let e = error(&format!("models: {}", "[".repeat(50_000)));
        assert_eq!(e.to_string(), "line 1: lists and mappings nest deeper than 64 levels");
        assert!(started.elapsed().as_secs_f64() < 1.0);
        assert!(PolicyConfig::from_yaml(EXAMPLE).is_ok());
    }

    #[test]
    fn classes_resolve_by_name_then_family_and_uncached_bucket() {
        let c = PolicyConfig::from_yaml(EXAMPLE).unwrap();
        let p = c.profile(None).unwrap();
        let name = |requested: Option<&str>, uncached: u64| p.class(p.resolve(requested, uncached)).name.as_str();
        // An exact class name wins whatever the cache holds; family names are not class names.
        assert_eq!(p.direct(Some("vip")), Some(4));
        assert_eq!(name(Some("vip"), 0), "vip");
        assert_eq!(p.direct(Some("latency")), None);
        // Family + bucket: buckets start at their min_tokens (0-31 cached, 32 and up uncached).
        assert_eq!(name(Some("latency"), 0), "lat_cached");
        assert_eq!(name(Some("latency"), 31), "lat_cached");
        assert_eq!(name(Some("latency"), 32), "lat_uncached");
        assert_eq!(name(Some("latency"), u64::MAX), "lat_uncached");
        // No class or an unknown one: the default family.
        assert_eq!(name(None, 5), "std_cached");
        assert_eq!(name(Some("nonesuch"), 100), "std_uncached");
        // A class name that is also bound to a family is reached by its family, not its name.
        assert_eq!(name(Some("lat_cached"), 100), "std_uncached");
        let lat = p.class(3);
        assert_eq!(
            (lat.quantum, lat.prefill_busy_threshold_frac, lat.request_queue_limit_per_worker),
            (4, Some(0.5), Some(1))
        );
        assert_eq!(p.class(1).queue_policy, QueuePolicy::Wspt);
        assert_eq!(p.class(0).queue_policy, QueuePolicy::Fcfs, "fcfs by default");
    }

    #[test]
    fn a_model_profile_replaces_the_root_one() {
        let c = PolicyConfig::from_yaml(EXAMPLE).unwrap();
        let small = c.profile(Some("small")).unwrap();
        assert_eq!(small.classes().len(), 1);
        assert_eq!(small.class(small.resolve(Some("latency"), 1000)).name, "only_all");
        assert_eq!(c.profile(Some("other")).unwrap().classes().len(), 5, "other models get the root profile");
        let models_only = EXAMPLE.split("models:").nth(1).unwrap();
        let c = PolicyConfig::from_yaml(&format!("models:{models_only}")).unwrap();
        assert!(c.profile(Some("other")).is_none(), "no root profile: the router keeps its synthetic queue");
        assert!(c.profile(None).is_none());
    }

    #[test]
    fn busy_thresholds_are_absolute_or_fractions_of_the_batch_budget() {
        let c = PolicyConfig::from_yaml(EXAMPLE).unwrap();
        let p = c.profile(None).unwrap();
        let (std, lat0, lat_half) = (p.class(0), p.class(2), p.class(3));
        assert!(!std.queueing() && !std.busy(1_000_000, 64), "no threshold: never busy, never queues");
        assert!(lat0.queueing() && !lat0.busy(0, 64) && lat0.busy(1, 64), "busy above 0 tokens");
        assert!(!lat_half.busy(32, 64) && lat_half.busy(33, 64), "busy above 0.5 × 64");
        let synthetic = PolicyProfile::synthetic(Some(0.5), QueuePolicy::Lcfs);
        assert_eq!(synthetic.classes().len(), 1);
        assert_eq!(synthetic.direct(Some("anything")), Some(0));
        assert!(synthetic.class(0).busy(33, 64) && !synthetic.class(0).busy(32, 64));
        assert!(!PolicyProfile::synthetic(None, QueuePolicy::Fcfs).queueing());
    }

    #[test]
    fn errors_name_the_key_path() {
        let e = error("default_policy_family: a\npolicy_classes: []\nuncached_isl_buckets: []\nextra: 1\n");
        assert!(e.message.contains("unknown field `extra`"), "{e}");
        let e = error(&EXAMPLE.replace("quantum: 4,", "quantum: 4, quantun: 1,"));
        assert_eq!(e.path, "policy_classes[3]", "{e}");
        assert!(e.message.contains("unknown field `quantun`"), "{e}");
        let e = error(&EXAMPLE.replace("quantum: 2,", "quantum: -2,"));
        assert_eq!(e.path, "policy_classes[1].quantum", "{e}");
        let e = error(&EXAMPLE.replace("quantum: 2,", "quantum: 0,"));
        assert_eq!((e.path.as_str(), e.message.as_str()), ("policy_classes[1].quantum", "must be greater than zero"));
        let e = error(&EXAMPLE.replace("queue_policy: wspt", "queue_policy: lcfs"));
        assert_eq!(e.path, "policy_classes[1].queue_policy");
        let e = error(&EXAMPLE.replace("{min_tokens: 0, bucket: cached}", "{min_tokens: 1, bucket: cached}"));
        assert_eq!(e.path, "uncached_isl_buckets[0].min_tokens");
        let e = error(&EXAMPLE.replace("{min_tokens: 32, bucket: uncached}", "{min_tokens: 0, bucket: uncached}"));
        assert_eq!(e.path, "uncached_isl_buckets[1].min_tokens");
        let e = error(&EXAMPLE.replace("cache_bucket: uncached, quantum: 2", "cache_bucket: hot, quantum: 2"));
        assert_eq!(e.path, "policy_classes[1].cache_bucket");
        let e = error(
            &EXAMPLE
                .replace("{name: std_uncached, policy_family: standard,", "{name: std_uncached, policy_family: other,"),
        );
        assert_eq!(e.path, "policy_classes", "{e}");
        assert!(e.message.contains("\"standard\" and bucket \"uncached\""), "{e}");
        let e = error(&EXAMPLE.replace("default_policy_family: standard", "default_policy_family: batch"));
        assert_eq!(e.path, "default_policy_family");
        let e = error(&EXAMPLE.replace("{name: vip,", "{name: latency,"));
        assert_eq!(e.path, "policy_classes[4].name", "an explicit class named like a family");
        let e = error(&EXAMPLE.replace("{name: vip,", "{name: std_cached,"));
        assert_eq!(e.path, "policy_classes[4].name", "a duplicate class");
        let e = error(&EXAMPLE.replace("{name: vip, quantum: 8}", "{name: vip, policy_family: standard, quantum: 8}"));
        assert_eq!(e.path, "policy_classes[4]", "a family without a bucket");
        let e = error(&EXAMPLE.replace("{name: vip,", "{name: \"v i p\","));
        assert_eq!(e.path, "policy_classes[4].name", "names are identifiers");
        let e = error(&EXAMPLE.replace("quantum: 5}", "quantum: 0}"));
        assert_eq!(e.path, "models.small.policy_classes[0].quantum");
        let e = error("default_policy_family: standard\n");
        assert!(e.message.contains("together"), "{e}");
        let e = error("models: {}\n");
        assert!(e.message.contains("root profile or at least one model profile"), "{e}");
        let e = error(&format!("{EXAMPLE}router: {{router_queue_threshold: 1}}\n"));
        assert_eq!(e.path, "router");
        let e = error("- a list\n");
        assert!(e.path.is_empty(), "{e}");
    }
}
