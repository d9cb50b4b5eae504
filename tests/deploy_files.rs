//! docker-compose.yml, the Prometheus config, the leafd configs it mounts, the Grafana files and
//! the Kubernetes manifests (deploy/kubernetes/) are consistent with each other and with what
//! leafd really accepts and exports. scripts/validate-kubernetes.sh checks the manifests against
//! Kubernetes' schemas; these tests check what a schema cannot.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::Path;

use leafd::config::{Config, CoordinatorKind};
use yaml_rust2::{Yaml, YamlLoader};

fn load_yaml(path: &str) -> Yaml {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    YamlLoader::load_from_str(&text)
        .unwrap_or_else(|e| panic!("{path}: {e}"))
        .remove(0)
}

fn port_of(addr: &str) -> &str {
    addr.rsplit(':').next().unwrap()
}

fn read(path: &str) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The entry of a YAML list (containers, ports, env, volumes…) whose `name` is `name`.
fn named<'a>(list: &'a Yaml, name: &str) -> &'a Yaml {
    list.as_vec()
        .unwrap_or_else(|| panic!("not a list: {list:?}"))
        .iter()
        .find(|item| item["name"].as_str() == Some(name))
        .unwrap_or_else(|| panic!("no entry named {name} in {list:?}"))
}

fn strings(list: &Yaml) -> Vec<&str> {
    list.as_vec()
        .unwrap_or_else(|| panic!("not a list: {list:?}"))
        .iter()
        .map(|item| {
            item.as_str()
                .unwrap_or_else(|| panic!("not a string: {item:?}"))
        })
        .collect()
}

/// The leafd config a compose service mounts at /etc/leafd/leafd.toml, with its host path.
fn compose_node_config(service: &Yaml) -> (String, Config) {
    let host = strings(&service["volumes"])
        .into_iter()
        .find_map(|mount| {
            let (host, container) = mount.split_once(':')?;
            container
                .starts_with("/etc/leafd/leafd.toml")
                .then_some(host)
        })
        .expect("a mount of /etc/leafd/leafd.toml");
    let config = Config::from_file(Path::new(host)).unwrap();
    (host.to_string(), config)
}

/// The uid of the Dockerfile's `USER uid:gid`.
fn image_uid() -> String {
    let dockerfile = read("Dockerfile");
    let user = dockerfile
        .lines()
        .find_map(|line| line.strip_prefix("USER "))
        .expect("the Dockerfile sets USER");
    user.split(':').next().unwrap().trim().to_string()
}

#[test]
fn compose_services_mounts_ports_and_configs_are_consistent() {
    let compose = load_yaml("docker-compose.yml");
    let services = compose["services"].as_hash().expect("services");
    let names: BTreeSet<&str> = services.keys().filter_map(|k| k.as_str()).collect();
    assert_eq!(
        names,
        BTreeSet::from([
            "grafana",
            "leafd-1",
            "leafd-2",
            "mysql",
            "prometheus",
            "zookeeper"
        ])
    );
    assert!(Path::new("Dockerfile").is_file());

    let mut scrape_targets = HashSet::new();
    for node in ["leafd-1", "leafd-2"] {
        let service = &compose["services"][node];
        assert_eq!(
            service["build"].as_str(),
            Some("."),
            "{node} is built from the repo"
        );
        let mount = service["volumes"][0].as_str().unwrap();
        let (host, container) = mount.split_once(':').unwrap();
        assert!(container.starts_with("/etc/leafd/leafd.toml"), "{mount}");
        let config = Config::from_file(Path::new(host)).unwrap();
        leafd::app::validate_config(&config).unwrap();
        assert!(config
            .storage
            .url
            .starts_with("mysql://root:leaf@mysql:3306/leaf"));
        assert_eq!(config.snowflake.coordinator, CoordinatorKind::Zookeeper);
        assert_eq!(config.snowflake.zookeeper.connect, "zookeeper:2181");
        assert_eq!(
            config.snowflake.zookeeper.advertise.as_deref(),
            Some(&*format!("{node}:6380"))
        );
        // Published ports map to the ports leafd listens on.
        let ports: Vec<&str> = service["ports"]
            .as_vec()
            .unwrap()
            .iter()
            .map(|p| p.as_str().unwrap().rsplit(':').next().unwrap())
            .collect();
        assert_eq!(
            ports,
            vec![port_of(&config.server.bind), port_of(&config.http.bind)]
        );
        scrape_targets.insert(format!("{node}:{}", port_of(&config.http.bind)));
    }
    let mysql = &compose["services"]["mysql"]["environment"];
    assert_eq!(mysql["MYSQL_ROOT_PASSWORD"].as_str(), Some("leaf"));
    assert_eq!(mysql["MYSQL_DATABASE"].as_str(), Some("leaf"));

    // Prometheus scrapes exactly the two leafd HTTP listeners.
    let prom_mount = compose["services"]["prometheus"]["volumes"][0]
        .as_str()
        .unwrap();
    let prometheus = load_yaml(prom_mount.split(':').next().unwrap());
    let targets: HashSet<String> = prometheus["scrape_configs"][0]["static_configs"][0]["targets"]
        .as_vec()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap().to_string())
        .collect();
    assert_eq!(targets, scrape_targets);

    // Grafana's mounts exist and point at the provisioning and dashboard folders.
    for mount in compose["services"]["grafana"]["volumes"].as_vec().unwrap() {
        let host = mount.as_str().unwrap().split(':').next().unwrap();
        assert!(Path::new(host).is_dir(), "{host}");
    }
    let provider = load_yaml("grafana/provisioning/dashboards/leafd.yml");
    assert_eq!(
        provider["providers"][0]["options"]["path"].as_str(),
        Some("/var/lib/grafana/dashboards")
    );
    let datasource = load_yaml("grafana/provisioning/datasources/prometheus.yml");
    assert_eq!(
        datasource["datasources"][0]["uid"].as_str(),
        Some("prometheus")
    );
    assert_eq!(
        datasource["datasources"][0]["url"].as_str(),
        Some("http://prometheus:9090")
    );
}

#[test]
fn dashboard_queries_only_metrics_leafd_defines() {
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string("grafana/dashboards/leafd.json").unwrap())
            .unwrap();
    let source = std::fs::read_to_string("src/metrics/names.rs").unwrap();
    let panels = dashboard["panels"].as_array().unwrap();
    assert!(panels.len() >= 12);
    for panel in panels {
        assert_eq!(panel["datasource"]["uid"], "prometheus");
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap();
            let metrics: Vec<&str> = expr
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .filter(|w| w.starts_with("leafd_"))
                .collect();
            assert!(!metrics.is_empty(), "{expr}");
            for metric in metrics {
                let base = metric
                    .trim_end_matches("_bucket")
                    .trim_end_matches("_sum")
                    .trim_end_matches("_count");
                assert!(
                    source.contains(&format!("\"{base}\"")),
                    "{metric} in {expr} is not defined in src/metrics/names.rs"
                );
            }
        }
    }
}

#[test]
fn alert_rules_use_only_metrics_leafd_defines_and_are_loaded() {
    let rules = load_yaml("docker/alerts.yml");
    let source = std::fs::read_to_string("src/metrics/names.rs").unwrap();
    let mut alerts = 0;
    for group in rules["groups"].as_vec().unwrap() {
        for rule in group["rules"].as_vec().unwrap() {
            let expr = rule["expr"].as_str().unwrap();
            alerts += 1;
            for metric in expr
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .filter(|w| w.starts_with("leafd_"))
            {
                assert!(
                    source.contains(&format!("\"{metric}\"")),
                    "{metric} in {expr} is not defined in src/metrics/names.rs"
                );
            }
        }
    }
    assert!(alerts >= 3);
    let prometheus = load_yaml("docker/prometheus.yml");
    assert_eq!(
        prometheus["rule_files"][0].as_str(),
        Some("/etc/prometheus/alerts.yml")
    );
    let compose = std::fs::read_to_string("docker-compose.yml").unwrap();
    assert!(compose.contains("./docker/alerts.yml:/etc/prometheus/alerts.yml:ro"));
}

#[test]
fn compose_nodes_are_reachable_keep_their_state_and_start_in_order() {
    let compose = load_yaml("docker-compose.yml");
    let compose_text = read("docker-compose.yml");
    let readme = read("README.md");
    let dockerfile = read("Dockerfile");
    let declared_volumes = compose["volumes"].as_hash().expect("top-level volumes");
    let mut state_volumes = HashSet::new();
    for node in ["leafd-1", "leafd-2"] {
        let service = &compose["services"][node];
        let (host, config) = compose_node_config(service);
        // Clients reach the nodes through Docker's bridge, not loopback: without a password,
        // protected mode would answer them -DENIED. The docs show how to connect.
        match &config.server.requirepass {
            Some(password) => {
                let host_port = service["ports"][0]
                    .as_str()
                    .unwrap()
                    .split(':')
                    .nth(1)
                    .unwrap();
                let cli = format!("redis-cli -p {host_port} -a {password}");
                assert!(
                    compose_text.contains(&cli),
                    "docker-compose.yml shows `{cli}`"
                );
                assert!(readme.contains(&cli), "README shows `{cli}`");
            }
            None => assert!(
                !config.server.protected_mode,
                "{host}: set server.requirepass, or protected_mode = false with a reason"
            ),
        }
        assert_eq!(service["restart"].as_str(), Some("on-failure"), "{node}");
        for dependency in ["mysql", "zookeeper"] {
            assert_eq!(
                service["depends_on"][dependency]["condition"].as_str(),
                Some("service_healthy"),
                "{node} waits for {dependency} to be healthy"
            );
        }

        // The state directory is a named volume of the node's own, and every file leafd keeps
        // is in it; the image creates it owned by leafd (a new named volume copies that).
        let state_dir = config.storage.state_dir();
        assert!(
            state_dir.is_absolute(),
            "{host}: storage.state_dir {state_dir:?} is absolute"
        );
        let state_mount = strings(&service["volumes"])
            .into_iter()
            .find(|mount| mount.split(':').nth(1) == state_dir.to_str())
            .unwrap_or_else(|| panic!("{node} mounts a volume at {state_dir:?}"));
        let volume = state_mount.split(':').next().unwrap();
        assert!(
            declared_volumes.contains_key(&Yaml::String(volume.into())),
            "{volume} is a named volume"
        );
        assert!(
            state_volumes.insert(volume.to_string()),
            "{volume} is shared by two nodes"
        );
        assert!(config
            .snowflake
            .fence_path(&config.storage)
            .starts_with(&state_dir));
        if config.snowflake.coordinator == CoordinatorKind::Zookeeper {
            assert!(
                Path::new(&config.snowflake.zookeeper.cache_file).starts_with(&state_dir),
                "{host}: the worker-id cache is in the state directory"
            );
        }
        assert!(
            dockerfile.contains(state_dir.to_str().unwrap()),
            "the Dockerfile creates {state_dir:?}"
        );

        // The healthcheck asks the node's own /ready.
        let probe = strings(&service["healthcheck"]["test"]).join(" ");
        assert!(
            probe.contains(&format!(
                "/dev/tcp/127.0.0.1/{}",
                port_of(&config.http.bind)
            )) && probe.contains("GET /ready "),
            "{node}: {probe}"
        );
    }

    let zookeeper = &compose["services"]["zookeeper"];
    let probe = strings(&zookeeper["healthcheck"]["test"]).join(" ");
    assert!(probe.contains("ruok") && probe.contains("imok"), "{probe}");
    assert!(zookeeper["environment"]["ZOO_4LW_COMMANDS_WHITELIST"]
        .as_str()
        .unwrap()
        .split(',')
        .any(|command| command.trim() == "ruok"));

    let ignore = read(".dockerignore");
    let ignored: HashSet<&str> = ignore
        .lines()
        .map(|line| line.trim().trim_matches('/'))
        .collect();
    for entry in ["target", ".git", "data"] {
        assert!(ignored.contains(entry), ".dockerignore lists {entry}");
    }
}

const KUBERNETES: &str = "deploy/kubernetes";

/// The `*.yaml` files of `dir` but kustomization.yaml, checked to be exactly the resources its
/// kustomization.yaml lists.
fn kustomized_files(dir: &str) -> Vec<String> {
    let mut files: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{dir}: {e}"))
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.ends_with(".yaml") && name.as_str() != "kustomization.yaml")
        .collect();
    files.sort();
    let kustomization = load_yaml(&format!("{dir}/kustomization.yaml"));
    assert_eq!(kustomization["kind"].as_str(), Some("Kustomization"));
    let mut listed: Vec<String> = strings(&kustomization["resources"])
        .into_iter()
        .map(String::from)
        .collect();
    listed.sort();
    assert_eq!(
        listed, files,
        "{dir}/kustomization.yaml lists every manifest beside it"
    );
    files
}

fn manifest<'a>(by_kind: &'a HashMap<String, Yaml>, kind: &str) -> &'a Yaml {
    by_kind
        .get(kind)
        .unwrap_or_else(|| panic!("a {kind} in {KUBERNETES}"))
}

#[test]
fn kubernetes_manifests_run_a_valid_config_and_fit_together() {
    let mut by_kind = HashMap::new();
    for file in kustomized_files(KUBERNETES) {
        let path = format!("{KUBERNETES}/{file}");
        let docs =
            YamlLoader::load_from_str(&read(&path)).unwrap_or_else(|e| panic!("{path}: {e}"));
        for doc in docs {
            let kind = doc["kind"].as_str().expect("kind").to_string();
            assert!(by_kind.insert(kind.clone(), doc).is_none(), "one {kind}");
        }
    }

    // The ConfigMap's leafd.toml is a config leafd accepts; the secrets are not in it.
    let configmap = manifest(&by_kind, "ConfigMap");
    let config = Config::from_toml(
        configmap["data"]["leafd.toml"]
            .as_str()
            .expect("the ConfigMap holds leafd.toml"),
    )
    .unwrap();
    leafd::app::validate_config(&config).unwrap();
    assert_eq!(config.snowflake.coordinator, CoordinatorKind::Database);
    assert!(config.server.requirepass.is_none() && config.server.users.is_empty());
    assert_eq!(
        config.storage.url,
        leafd::config::StorageConfig::default().url,
        "the database URL comes from the Secret, not the ConfigMap"
    );

    let deployment = manifest(&by_kind, "Deployment");
    assert_eq!(deployment["spec"]["replicas"].as_i64(), Some(3));
    let pod = &deployment["spec"]["template"]["spec"];
    // A Service named leafd would otherwise give the pods LEAFD_PORT=tcp://…, which leafd reads
    // as its port and refuses.
    assert_eq!(pod["enableServiceLinks"].as_bool(), Some(false));
    let container = &pod["containers"][0];
    assert!(pod["containers"][1].is_badvalue(), "one container");

    // leafd reads the ConfigMap's file.
    let args = strings(&container["args"]);
    assert_eq!(args.len(), 2);
    assert_eq!(args[0], "--config");
    let configmap_name = configmap["metadata"]["name"].as_str().unwrap();
    let config_volume = pod["volumes"]
        .as_vec()
        .unwrap()
        .iter()
        .find(|volume| volume["configMap"]["name"].as_str() == Some(configmap_name))
        .expect("a volume of the ConfigMap");
    let config_mount = named(
        &container["volumeMounts"],
        config_volume["name"].as_str().unwrap(),
    );
    assert_eq!(
        Path::new(config_mount["mountPath"].as_str().unwrap())
            .join("leafd.toml")
            .as_path(),
        Path::new(args[1])
    );

    // The database URL and the password come from the Secret, which must exist (no silent
    // SQLite file per pod), and the example Secret holds placeholders only.
    let secret = manifest(&by_kind, "Secret");
    for variable in ["LEAFD_STORAGE_URL", "LEAFD_REQUIREPASS"] {
        let reference = &named(&container["env"], variable)["valueFrom"]["secretKeyRef"];
        assert_eq!(reference["name"], secret["metadata"]["name"], "{variable}");
        assert_ne!(reference["optional"].as_bool(), Some(true), "{variable}");
        let key = reference["key"].as_str().unwrap();
        let value = secret["stringData"][key]
            .as_str()
            .unwrap_or_else(|| panic!("the Secret has {key}"));
        assert!(
            value.contains("CHANGE-ME"),
            "secret.yaml holds a placeholder for {key}"
        );
    }

    // Ports and probes are leafd's listeners and paths.
    let ports = &container["ports"];
    for (name, bind) in [("resp", &config.server.bind), ("http", &config.http.bind)] {
        assert_eq!(
            named(ports, name)["containerPort"].as_i64(),
            Some(port_of(bind).parse::<i64>().unwrap()),
            "{name}"
        );
    }
    for (probe, path) in [("livenessProbe", "/health"), ("readinessProbe", "/ready")] {
        assert_eq!(container[probe]["httpGet"]["path"].as_str(), Some(path));
        assert_eq!(container[probe]["httpGet"]["port"].as_str(), Some("http"));
    }

    // The state directory is a writable volume (the root filesystem is read-only).
    let state_dir = config.storage.state_dir();
    assert!(state_dir.is_absolute(), "{state_dir:?}");
    let state_mount = container["volumeMounts"]
        .as_vec()
        .unwrap()
        .iter()
        .find(|mount| mount["mountPath"].as_str() == state_dir.to_str())
        .unwrap_or_else(|| panic!("a volume at storage.state_dir {state_dir:?}"));
    assert_ne!(state_mount["readOnly"].as_bool(), Some(true));
    let state_volume = named(&pod["volumes"], state_mount["name"].as_str().unwrap());
    assert!(
        !state_volume["emptyDir"].is_badvalue()
            || !state_volume["persistentVolumeClaim"].is_badvalue()
    );
    assert!(config
        .snowflake
        .fence_path(&config.storage)
        .starts_with(&state_dir));

    // Locked down, as the image's own user.
    let security = &container["securityContext"];
    assert_eq!(security["readOnlyRootFilesystem"].as_bool(), Some(true));
    assert_eq!(security["allowPrivilegeEscalation"].as_bool(), Some(false));
    assert_eq!(strings(&security["capabilities"]["drop"]), vec!["ALL"]);
    assert_eq!(pod["securityContext"]["runAsNonRoot"].as_bool(), Some(true));
    assert_eq!(
        pod["securityContext"]["runAsUser"]
            .as_i64()
            .map(|uid| uid.to_string()),
        Some(image_uid()),
        "runAsUser is the Dockerfile's USER"
    );
    for bound in ["requests", "limits"] {
        assert!(
            container["resources"][bound]["memory"].as_str().is_some(),
            "resources.{bound}.memory"
        );
    }

    // The stop fits in the grace period: the preStop sleep, the drain, then closing.
    let pre_stop = strings(&container["lifecycle"]["preStop"]["exec"]["command"]);
    assert_eq!(pre_stop[0], "sleep");
    let sleep: i64 = pre_stop[1].parse().unwrap();
    let drain = i64::try_from(config.server.shutdown_timeout_secs).unwrap();
    let grace = pod["terminationGracePeriodSeconds"].as_i64().unwrap();
    assert!(
        grace >= sleep + drain + 5,
        "terminationGracePeriodSeconds {grace} < preStop {sleep} + shutdown_timeout_secs {drain} + 5"
    );

    // The Service, the budget and the Deployment select the same pods, on the container's ports.
    let labels = &deployment["spec"]["template"]["metadata"]["labels"];
    assert_eq!(&deployment["spec"]["selector"]["matchLabels"], labels);
    let service = manifest(&by_kind, "Service");
    assert_eq!(&service["spec"]["selector"], labels);
    let mut service_ports = BTreeSet::new();
    for port in service["spec"]["ports"].as_vec().unwrap() {
        let target = port["targetPort"].as_str().unwrap();
        assert_eq!(
            named(ports, target)["containerPort"],
            port["port"],
            "{target}"
        );
        service_ports.insert(target);
    }
    assert_eq!(service_ports, BTreeSet::from(["http", "resp"]));
    let budget = manifest(&by_kind, "PodDisruptionBudget");
    assert_eq!(&budget["spec"]["selector"]["matchLabels"], labels);

    // The optional Prometheus Operator objects: the same alerts as docker/alerts.yml, and a
    // scrape of the Service's HTTP port.
    let monitoring = format!("{KUBERNETES}/monitoring");
    kustomized_files(&monitoring);
    let rule = load_yaml(&format!("{monitoring}/prometheusrule.yaml"));
    let alerts = load_yaml("docker/alerts.yml");
    assert_eq!(
        rule["spec"]["groups"], alerts["groups"],
        "monitoring/prometheusrule.yaml has docker/alerts.yml's groups"
    );
    let monitor = load_yaml(&format!("{monitoring}/servicemonitor.yaml"));
    assert_eq!(
        &monitor["spec"]["selector"]["matchLabels"],
        &service["metadata"]["labels"]
    );
    for endpoint in monitor["spec"]["endpoints"].as_vec().unwrap() {
        named(
            &service["spec"]["ports"],
            endpoint["port"].as_str().unwrap(),
        );
        assert_eq!(endpoint["path"].as_str(), Some("/metrics"));
    }

    let readme = read("README.md");
    assert!(readme.contains("kubectl apply -k deploy/kubernetes/"));
    assert!(Path::new("scripts/validate-kubernetes.sh").is_file());
}
