import { api, call } from "./signing.js";
import { session } from "./polling.js";

// Every control calls the public API (call() above, or the runtime door for Try it),
// signed like the page's reads: the gateway decides, as for boto3. The key's own
// permissions (GET /console/api/whoami) only disable, ahead of time, what it would
// refuse, and say why.

export const pageName = document.getElementById("content").dataset.name || "";
const outcome = document.getElementById("outcome");
let permissions = { allow: ["*"], resources: ["*"], arn: "" };

function wildcard(pattern) {
  const escaped = pattern.toLowerCase().replace(/[.+^${}()|[\]\\]/g, "\\$&");
  return new RegExp(`^${escaped.replace(/\*/g, ".*").replace(/\?/g, ".")}$`, "s");
}

const arnOf = (kind, name) => `${permissions.arn}:${kind}/${name.toLowerCase()}`;

// Why the key may not call `action` on the resource `kind`/`name` ("" when it may).
function forbidden(action, kind, name) {
  if (!permissions.allow.some((p) => wildcard(p).test(action.toLowerCase()))) {
    return `Your key may not call ${action}.`;
  }
  if (kind && name && !permissions.resources.some((p) => wildcard(p).test(arnOf(kind, name)))) {
    return `Your key may not call ${action} on ${kind} ${name}.`;
  }
  return "";
}

export function guard(root) {
  for (const element of root.querySelectorAll("[data-needs]")) {
    const why = forbidden(element.dataset.needs, element.dataset.on, pageName);
    const controls = element.tagName === "FORM"
      ? element.querySelectorAll("button, input, select, textarea") : [element];
    for (const control of controls) {
      control.disabled = Boolean(why);
      if (why) {
        control.setAttribute("aria-description", why);
        control.title = why;
      } else {
        control.removeAttribute("aria-description");
        control.removeAttribute("title");
      }
    }
  }
}

export function announce(text, failed) {
  outcome.textContent = text;
  outcome.setAttribute("role", failed ? "alert" : "status");
  outcome.dataset.kind = failed ? "bad" : "good";
}

export const failure = (err) => (err.type ? `${err.type}: ${err.message}` : String(err.message || err));

// The element `tag` with `props`, its children text or nodes: no HTML is parsed.
export function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(props)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") node.className = v;
    else if (k in node && typeof v !== "string") node[k] = v;
    else node.setAttribute(k, v === true ? "" : v);
  }
  node.append(...children.filter((c) => c !== null && c !== undefined));
  return node;
}

const field = (label, input) => el("label", {}, label + " ", input);

// A panel's form: fields, a submit button, and what to do on submit.
function panelForm(panel, parts, submitLabel, run) {
  const submit = el("button", { type: "submit" }, submitLabel);
  const cancel = el("button", { type: "button", class: "link" }, "Cancel");
  const form = el("form", {}, ...parts, el("div", { class: "buttons" }, submit, cancel));
  cancel.addEventListener("click", () => closePanel(panel));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    submit.disabled = true;
    try {
      const said = await run(form);
      if (said) announce(said, false);
      closePanel(panel);
    } catch (err) {
      announce(failure(err), true);
    } finally {
      submit.disabled = false;
    }
  });
  panel.replaceChildren(el("h2", {}, panel.getAttribute("aria-label")), form);
  return form;
}

function closePanel(panel) {
  panel.hidden = true;
  panel.replaceChildren();
  const opener = document.querySelector(`[data-open="${panel.dataset.panel}"]`);
  if (opener) opener.focus();
}

// Leave a resource gone: stop every poller first, so nothing more is called for it.
function leave(url) {
  session.generation += 1;
  location.assign(url);
}

function confirmDelete(panel, what, consequence, run) {
  const confirm = el("input", { name: "confirm", autocomplete: "off", required: true });
  const form = panelForm(
    panel,
    [el("p", {}, consequence), field(`Type “${pageName}” to confirm. Confirm`, confirm)],
    "Delete",
    async () => {
      if (confirm.value !== pageName) throw new Error(`Type the ${what}'s name to confirm.`);
      await run();
      return "";
    },
  );
  confirm.setAttribute("aria-label", "Confirm");
  return form;
}

const describeEndpoint = () => call("sagemaker:DescribeEndpoint", { EndpointName: pageName });

async function componentsOf(endpoint) {
  const listed = await call("sagemaker:ListInferenceComponents", {
    EndpointNameEquals: endpoint, MaxResults: 100,
  });
  return Promise.all((listed.InferenceComponents || []).map((c) =>
    call("sagemaker:DescribeInferenceComponent", {
      InferenceComponentName: c.InferenceComponentName,
    })));
}

const number = (name, value, min = 0) =>
  el("input", { name, type: "number", min: String(min), step: "1", value: String(value), required: true });

const PANELS = {
  async weights(panel) {
    const endpoint = await describeEndpoint();
    const components = await componentsOf(pageName);
    const groups = [];
    for (const v of endpoint.ProductionVariants || []) {
      const weight = el("input", {
        name: "weight", type: "number", min: "0", step: "any",
        value: String(v.CurrentWeight ?? v.DesiredWeight ?? 1), required: true,
      });
      const count = number("instances", v.DesiredInstanceCount ?? v.CurrentInstanceCount ?? 1);
      groups.push(el("fieldset", { "data-variant": v.VariantName },
        el("legend", {}, v.VariantName), field("Weight", weight), field("Instances", count)));
    }
    for (const c of components) {
      const copies = number("instances", c.RuntimeConfig?.DesiredCopyCount ?? 1);
      groups.push(el("fieldset", { "data-component": c.InferenceComponentName },
        el("legend", {}, c.InferenceComponentName), field("Instances", copies),
        el("p", { class: "muted" }, "copies of this inference component")));
    }
    const before = JSON.stringify(groups.map((g) => [...g.querySelectorAll("input")].map((i) => i.value)));
    panelForm(panel, [
      el("p", { class: "muted" }, "Traffic moves at once, in proportion to the weights; "
        + "instances start or drain without dropping a request."),
      ...groups,
    ], "Apply", async (form) => {
      const now = JSON.stringify(groups.map((g) => [...g.querySelectorAll("input")].map((i) => i.value)));
      if (now === before) return "Nothing changed.";
      const variants = [...form.querySelectorAll("fieldset[data-variant]")].map((g) => ({
        VariantName: g.dataset.variant,
        DesiredWeight: Number(g.querySelector("[name=weight]").value),
        DesiredInstanceCount: Number(g.querySelector("[name=instances]").value),
      }));
      const said = [];
      const changedVariants = variants.filter((v, n) => {
        const was = endpoint.ProductionVariants[n];
        return v.DesiredWeight !== (was.CurrentWeight ?? was.DesiredWeight)
          || v.DesiredInstanceCount !== (was.DesiredInstanceCount ?? was.CurrentInstanceCount);
      });
      if (changedVariants.length) {
        await call("sagemaker:UpdateEndpointWeightsAndCapacities", {
          EndpointName: pageName, DesiredWeightsAndCapacities: changedVariants,
        });
        said.push(`UpdateEndpointWeightsAndCapacities: ${changedVariants.map((v) => v.VariantName).join(", ")}`);
      }
      for (const [n, g] of [...form.querySelectorAll("fieldset[data-component]")].entries()) {
        const copies = Number(g.querySelector("[name=instances]").value);
        if (copies === components[n].RuntimeConfig?.DesiredCopyCount) continue;
        await call("sagemaker:UpdateInferenceComponentRuntimeConfig", {
          InferenceComponentName: g.dataset.component, DesiredRuntimeConfig: { CopyCount: copies },
        });
        said.push(`${g.dataset.component}: ${copies} copies`);
      }
      return `Updating ${pageName} (${said.join("; ")}).`;
    });
  },

  async update(panel) {
    const [endpoint, listed] = await Promise.all([
      describeEndpoint(),
      call("sagemaker:ListEndpointConfigs", { MaxResults: 100, SortBy: "CreationTime", SortOrder: "Descending" }),
    ]);
    const configs = el("select", { name: "config", required: true },
      ...(listed.EndpointConfigs || []).map((c) => el("option", {
        value: c.EndpointConfigName, selected: c.EndpointConfigName === endpoint.EndpointConfigName ? true : false,
      }, c.EndpointConfigName + (c.EndpointConfigName === endpoint.EndpointConfigName ? " (current)" : ""))));
    const kinds = ["All at once", "Canary", "Linear", "Rolling"];
    const radios = kinds.map((k, n) => el("label", {},
      el("input", { type: "radio", name: "policy", value: k, checked: n === 0 ? true : false }), " " + k));
    const size = number("size", 1, 1);
    const unit = el("select", { name: "unit" }, el("option", { value: "INSTANCE_COUNT" }, "Instances"),
      el("option", { value: "CAPACITY_PERCENT" }, "Percent"));
    const wait = number("wait", 30, 0);
    const alarms = el("input", { name: "alarms", placeholder: "alarm names, comma-separated", autocomplete: "off" });
    panelForm(panel, [
      field("Endpoint config", configs),
      el("fieldset", { role: "radiogroup", "aria-label": "Deployment policy" },
        el("legend", {}, "Deployment policy"), ...radios),
      el("div", { class: "row" }, field("Size", size), field("Unit", unit)),
      field("Wait interval", wait), el("span", { class: "muted" }, " seconds between steps"),
      field("Rollback alarms", alarms),
      el("p", { class: "muted" }, "A new fleet starts beside the old one, takes traffic in the "
        + "steps chosen, and replaces it; an alarm going off rolls traffic back."),
    ], "Start update", async () => {
      const policy = panel.querySelector("[name=policy]:checked").value;
      const sized = { Type: unit.value, Value: Number(size.value) };
      const waitS = Number(wait.value);
      const names = alarms.value.split(",").map((a) => a.trim()).filter(Boolean);
      const deployment = {};
      if (policy === "Rolling") {
        deployment.RollingUpdatePolicy = { MaximumBatchSize: sized, WaitIntervalInSeconds: waitS };
      } else if (policy !== "All at once" || names.length) {
        const routing = { Type: "ALL_AT_ONCE", WaitIntervalInSeconds: waitS };
        if (policy === "Canary") Object.assign(routing, { Type: "CANARY", CanarySize: sized });
        if (policy === "Linear") Object.assign(routing, { Type: "LINEAR", LinearStepSize: sized });
        deployment.BlueGreenUpdatePolicy = { TrafficRoutingConfiguration: routing };
      }
      if (names.length) {
        deployment.AutoRollbackConfiguration = { Alarms: names.map((AlarmName) => ({ AlarmName })) };
      }
      const params = { EndpointName: pageName, EndpointConfigName: configs.value };
      if (Object.keys(deployment).length) params.DeploymentConfig = deployment;
      await call("sagemaker:UpdateEndpoint", params);
      return `Updating ${pageName} to ${configs.value} (${policy.toLowerCase()}).`;
    });
  },

  async scaling(panel) {
    const endpoint = await describeEndpoint();
    const names = (endpoint.ProductionVariants || []).map((v) => v.VariantName);
    const ids = names.map((v) => `endpoint/${pageName}/variant/${v}`);
    // What is set now, to edit it (none yet: the defaults).
    const [targets, policies] = await Promise.all([
      call("application-autoscaling:DescribeScalableTargets", { ServiceNamespace: "sagemaker", ResourceIds: ids }),
      call("application-autoscaling:DescribeScalingPolicies", { ServiceNamespace: "sagemaker" }),
    ]).catch(() => [{}, {}]);
    const variants = el("select", { name: "variant" }, ...names.map((v) => el("option", {}, v)));
    const low = number("min", 1, 1);
    const high = number("max", 4, 1);
    const target = el("input", { name: "target", type: "number", min: "1", step: "any", value: "100", required: true });
    const current = () => {
      const id = `endpoint/${pageName}/variant/${variants.value}`;
      const t = (targets.ScalableTargets || []).find((x) => x.ResourceId === id);
      const p = (policies.ScalingPolicies || []).find((x) => x.ResourceId === id
        && x.PolicyType === "TargetTrackingScaling");
      low.value = String(t ? t.MinCapacity : 1);
      high.value = String(t ? t.MaxCapacity : 4);
      target.value = String(p ? p.TargetTrackingScalingPolicyConfiguration.TargetValue : 100);
      target.dataset.policy = p ? p.PolicyName : "";
    };
    variants.addEventListener("change", current);
    current();
    panelForm(panel, [
      field("Variant", variants), field("Min instances", low), field("Max instances", high),
      field("Target invocations per instance", target),
      el("p", { class: "muted" }, "Target tracking: instances are added or removed to keep each "
        + "instance near the target invocations per minute."),
    ], "Save policy", async () => {
      const resource = `endpoint/${pageName}/variant/${variants.value}`;
      const dimension = "sagemaker:variant:DesiredInstanceCount";
      await call("application-autoscaling:RegisterScalableTarget", {
        ServiceNamespace: "sagemaker", ResourceId: resource, ScalableDimension: dimension,
        MinCapacity: Number(low.value), MaxCapacity: Number(high.value),
      });
      await call("application-autoscaling:PutScalingPolicy", {
        PolicyName: target.dataset.policy || `${pageName}-${variants.value}-invocations`,
        ServiceNamespace: "sagemaker",
        ResourceId: resource, ScalableDimension: dimension, PolicyType: "TargetTrackingScaling",
        TargetTrackingScalingPolicyConfiguration: {
          TargetValue: Number(target.value),
          PredefinedMetricSpecification: { PredefinedMetricType: "SageMakerVariantInvocationsPerInstance" },
        },
      });
      return `Scaling policy saved for ${variants.value}.`;
    });
  },

  async delete(panel) {
    confirmDelete(panel, "endpoint",
      `Deleting endpoint ${pageName} stops all its instances: every request to it fails `
      + "from then on. Its endpoint config and models stay.",
      async () => {
        await call("sagemaker:DeleteEndpoint", { EndpointName: pageName });
        leave("/console?deleted=" + encodeURIComponent(pageName));
      });
  },

  async "create-endpoint"(panel) {
    const name = el("input", { name: "endpoint", required: true, pattern: "[a-zA-Z0-9](-*[a-zA-Z0-9])*", maxlength: "63", autocomplete: "off" });
    const type = el("input", { name: "instanceType", value: "ml.m5.large", required: true });
    const count = number("instances", 1, 1);
    const routing = el("select", { name: "routing" },
      el("option", { value: "LEAST_OUTSTANDING_REQUESTS" }, "Least outstanding requests"),
      el("option", { value: "RANDOM" }, "Random"));
    const capture = el("input", { name: "capture", placeholder: "optional: s3:// or file:// URI" });
    const asyncOut = el("input", { name: "async", placeholder: "optional: makes it asynchronous" });
    panelForm(panel, [
      field("Endpoint name", name), field("Instance type", type), field("Instances", count),
      field("Routing strategy", routing), field("Capture to", capture),
      field("Async output path", asyncOut),
      el("p", { class: "muted" }, "Creates an endpoint config of the same name, then the endpoint."),
    ], "Create", async () => {
      const config = {
        EndpointConfigName: name.value,
        ProductionVariants: [{
          VariantName: "AllTraffic", ModelName: pageName, InstanceType: type.value,
          InitialInstanceCount: Number(count.value), RoutingConfig: { RoutingStrategy: routing.value },
        }],
      };
      if (capture.value) {
        config.DataCaptureConfig = {
          EnableCapture: true, InitialSamplingPercentage: 100, DestinationS3Uri: capture.value,
          CaptureOptions: [{ CaptureMode: "Input" }, { CaptureMode: "Output" }],
        };
      }
      if (asyncOut.value) config.AsyncInferenceConfig = { OutputConfig: { S3OutputPath: asyncOut.value } };
      await call("sagemaker:CreateEndpointConfig", config);
      await call("sagemaker:CreateEndpoint", { EndpointName: name.value, EndpointConfigName: name.value });
      leave(`/console/endpoints/${encodeURIComponent(name.value)}`);
    });
    name.focus();
  },

  async "delete-model"(panel) {
    confirmDelete(panel, "model", `Deleting model ${pageName} removes its definition; `
      + "endpoints already serving it keep serving.", async () => {
      await call("sagemaker:DeleteModel", { ModelName: pageName });
      leave("/console/models");
    });
  },

  async "delete-config"(panel) {
    confirmDelete(panel, "endpoint config", `Deleting endpoint config ${pageName} removes its `
      + "definition; endpoints running it keep running.", async () => {
      await call("sagemaker:DeleteEndpointConfig", { EndpointConfigName: pageName });
      leave("/console/endpoint-configs");
    });
  },

  async copies(panel) {
    const c = await call("sagemaker:DescribeInferenceComponent", { InferenceComponentName: pageName });
    const copies = number("instances", c.RuntimeConfig?.DesiredCopyCount ?? 1);
    panelForm(panel, [field("Instances", copies), el("span", { class: "muted" }, " copies")],
      "Apply", async () => {
        await call("sagemaker:UpdateInferenceComponentRuntimeConfig", {
          InferenceComponentName: pageName, DesiredRuntimeConfig: { CopyCount: Number(copies.value) },
        });
        return `Updating ${pageName} to ${copies.value} copies.`;
      });
  },

  async "stop-job"(panel) {
    stopJob(panel, true);
  },

  async "stop-transform"(panel) {
    stopJob(panel, false);
  },

  async "delete-component"(panel) {
    const c = await call("sagemaker:DescribeInferenceComponent", { InferenceComponentName: pageName });
    confirmDelete(panel, "inference component", `Deleting ${pageName} stops its copies on `
      + `${c.EndpointName}: requests naming it fail from then on.`, async () => {
      await call("sagemaker:DeleteInferenceComponent", { InferenceComponentName: pageName });
      leave(`/console/endpoints/${encodeURIComponent(c.EndpointName)}`);
    });
  },
};

function stopJob(panel, training) {
  const action = training ? "sagemaker:StopTrainingJob" : "sagemaker:StopTransformJob";
  const params = training ? { TrainingJobName: pageName } : { TransformJobName: pageName };
  panelForm(panel, [el("p", {}, `Stopping ${pageName} sends its processes SIGTERM, then `
    + "SIGKILL after the grace period; what it wrote so far stays where it is.")],
  "Stop", async () => {
    await call(action, params);
    return `Stopping ${pageName}.`;
  });
}

async function openPanel(button) {
  const key = button.dataset.open;
  const panel = document.querySelector(`[data-panel="${key}"]`);
  if (!panel) return;
  if (!panel.hidden) return closePanel(panel);
  for (const other of document.querySelectorAll("[data-panel]")) {
    if (other !== panel && !other.hidden) closePanel(other);
  }
  panel.hidden = false;
  panel.replaceChildren(el("p", { class: "muted" }, "Loading…"));
  try {
    await PANELS[key](panel);
    const first = panel.querySelector("input, select, textarea, button[type=submit]");
    if (first) first.focus();
  } catch (err) {
    panel.replaceChildren(el("p", { class: "problem" }, failure(err)));
  }
}

async function rollBack(button) {
  button.disabled = true;
  try {
    await call("cloudwatch:SetAlarmState", {
      AlarmName: button.dataset.rollback, StateValue: "ALARM",
      StateReason: "Rolled back from the console.",
    });
    announce(`Alarm ${button.dataset.rollback} set to ALARM: the deployment rolls back.`, false);
  } catch (err) {
    announce(failure(err), true);
    button.disabled = false;
  }
}

export async function startActions() {
  // A view replaced: its controls (a Roll back) disabled anew where the key may not.
  document.addEventListener("changed", (event) => guard(event.target));
  document.addEventListener("click", (event) => {
    const opener = event.target.closest("[data-open]");
    if (opener && !opener.disabled) openPanel(opener);
    const back = event.target.closest("[data-rollback]");
    if (back && !back.disabled) rollBack(back);
  });
  document.addEventListener("keydown", (event) => {
    if (event.key !== "Escape") return;
    const open = [...document.querySelectorAll("[data-panel]")].find((p) => !p.hidden);
    if (open) closePanel(open);
  });
  const deleted = new URLSearchParams(location.search).get("deleted");
  if (deleted) announce(`Deleting endpoint ${deleted}: its instances stop.`, false);
  try {
    const response = await api("/console/api/whoami");
    if (response.ok) permissions = await response.json();
  } catch (_) {
    // Left as it was: the gateway still decides each call.
  }
  guard(document);
}
