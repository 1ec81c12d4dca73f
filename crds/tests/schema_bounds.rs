//! The bounds the generated CRDs put on interface-name globs and on a NetworkTuning's name,
//! read from the schema itself, and the code's checks that mirror them.

use std::sync::LazyLock;

use hoststack_crds::manifests::crds;
use hoststack_crds::{
    check_interface_glob, INTERFACE_GLOB_MAX_BYTES, INTERFACE_GLOB_MAX_STARS, TUNING_NAME_MAX_CHARS,
};
use serde_json::Value;

/// The schema of `file`'s one version.
fn schema(file: &str) -> Value {
    let (_, crd) = crds()
        .into_iter()
        .find(|(f, _)| *f == file)
        .unwrap_or_else(|| panic!("no CRD {file}"));
    let version = &crd.spec.versions[0];
    serde_json::to_value(
        version
            .schema
            .as_ref()
            .unwrap()
            .open_api_v3_schema
            .as_ref()
            .unwrap(),
    )
    .unwrap()
}

/// The schema at `path` (property names, `[]` for an array's items) under `root`.
fn at<'a>(root: &'a Value, path: &[&str]) -> &'a Value {
    path.iter().fold(root, |v, p| match *p {
        "[]" => &v["items"],
        name => &v["properties"][name],
    })
}

/// The CEL rules on a schema node.
fn rules(node: &Value) -> Vec<&str> {
    node["x-kubernetes-validations"]
        .as_array()
        .map(|a| a.iter().filter_map(|r| r["rule"].as_str()).collect())
        .unwrap_or_default()
}

/// The interface-name glob's schema in both CRDs.
fn glob_schemas() -> Vec<Value> {
    let nwt = schema("networktunings.yaml");
    let nt = schema("nodetunings.yaml");
    let glob = ["interfaces", "[]", "match", "name"];
    let mut out = vec![at(&nwt, &[&["spec"][..], &glob[..]].concat()).clone()];
    for config in [&["spec", "config"][..], &["spec", "preview", "config"][..]] {
        out.push(at(&nt, &[config, &glob[..]].concat()).clone());
    }
    out
}

/// The regular expression of a `self.matches('...')` rule.
fn regex_of(rule: &str) -> regex::Regex {
    let inner = rule
        .strip_prefix("self.matches('")
        .and_then(|r| r.strip_suffix("')"))
        .unwrap_or_else(|| panic!("not a matches rule: {rule}"));
    regex::Regex::new(inner).unwrap()
}

#[test]
fn interface_globs_are_bounded_in_every_crd() {
    for glob in glob_schemas() {
        assert_eq!(glob["type"], "string", "{glob}");
        assert_eq!(glob["minLength"], 1, "{glob}");
        assert_eq!(glob["maxLength"], INTERFACE_GLOB_MAX_BYTES, "{glob}");
        assert_eq!(rules(&glob).len(), 2, "{glob}");
        let description = glob["description"].as_str().unwrap();
        assert!(
            description.contains(&format!("{INTERFACE_GLOB_MAX_BYTES} bytes"))
                && description.contains(&format!("{INTERFACE_GLOB_MAX_STARS} `*`")),
            "the description states the bounds: {description}"
        );
    }
}

#[test]
fn a_tuning_name_is_bounded_as_a_label_value_is() {
    let nwt = schema("networktunings.yaml");
    assert_eq!(
        rules(&nwt),
        [format!(
            "self.metadata.name.size() <= {TUNING_NAME_MAX_CHARS}"
        )]
    );
    // The operator puts the name into label values: the bound is the one the API puts on those
    // (here on the values of a selector's matchLabels).
    let label_value = at(&nwt, &["spec", "nodeSelector", "matchLabels"]);
    assert_eq!(
        label_value["additionalProperties"]["maxLength"],
        TUNING_NAME_MAX_CHARS
    );
}

#[test]
fn the_glob_check_refuses_with_the_reason() {
    let cases: &[(&str, Option<&str>)] = &[
        ("eth0", None),
        ("ens[13]f*", None),
        ("eth[!0]", None),
        ("eth[^0]", None),
        ("*a*b*c*d", None),
        ("", Some("is 0 bytes long")),
        ("eth\t0", Some("holds '\\t'")),
        ("eth0\n", Some("holds '\\n'")),
        ("eth é", Some("holds ' '")),
        ("ethé", Some("holds 'é'")),
        ("*a*b*c*d*", Some("holds 5 '*'")),
    ];
    for (glob, want) in cases {
        let got = check_interface_glob(glob).err();
        match want {
            None => assert_eq!(got, None, "{glob:?}"),
            Some(w) => assert!(
                got.as_deref().is_some_and(|g| g.starts_with(w)),
                "{glob:?}: {got:?}"
            ),
        }
    }
    let long = "e".repeat(INTERFACE_GLOB_MAX_BYTES + 1);
    assert!(check_interface_glob(&long[1..]).is_ok());
    assert_eq!(
        check_interface_glob(&long),
        Err(format!(
            "is 65 bytes long; an interface name glob has 1 to {INTERFACE_GLOB_MAX_BYTES} bytes"
        ))
    );
}

/// What the NetworkTuning schema accepts as an interface-name glob: its length bounds and its
/// CEL rules' regular expressions, read once.
static GLOB_SCHEMA: LazyLock<(usize, usize, Vec<regex::Regex>)> = LazyLock::new(|| {
    let schema = &glob_schemas()[0];
    let bound = |key: &str| schema[key].as_u64().unwrap() as usize;
    let regexes = rules(schema).into_iter().map(regex_of).collect();
    (bound("minLength"), bound("maxLength"), regexes)
});

proptest::proptest! {
    /// The agent's check accepts exactly what the schema does.
    #[test]
    fn the_glob_check_agrees_with_the_schema(
        glob in "([a-z0-9*?\\[\\]!^ \\t\\n\\x00\\x7f-]|é){0,12}|[a*]{60,70}",
    ) {
        let (min, max, regexes) = &*GLOB_SCHEMA;
        let by_schema = (*min..=*max).contains(&glob.len())
            && regexes.iter().all(|r| r.is_match(&glob));
        proptest::prop_assert_eq!(check_interface_glob(&glob).is_ok(), by_schema, "{:?}", glob);
    }
}
