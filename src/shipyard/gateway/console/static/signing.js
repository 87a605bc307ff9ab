// SigV4 in the browser, and the calls the console makes: its views (api), the public
// API's actions (call) and the runtime doors (send). With an auth: section
// (body[data-auth="1"]) each is signed with the key the user entered, kept in this tab's
// sessionStorage, with Web Crypto's HMAC-SHA256, exactly as botocore signs, so the
// gateway's own verifier (gateway/edge/auth.py) checks it and scopes it as boto3's.

export const AUTH = document.body.dataset.auth === "1";
const REGION = document.body.dataset.region || "us-east-1";
const SERVICE = "sagemaker";
export const STORAGE_KEY = "shipyard.console.key";
const EMPTY_SHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
const encoder = new TextEncoder();

export class AuthError extends Error {
  constructor(type, message) {
    super(message);
    this.type = type;
  }
}

export function credentials() {
  try {
    return JSON.parse(sessionStorage.getItem(STORAGE_KEY) || "null");
  } catch (_) {
    return null;
  }
}

const hex = (buffer) =>
  Array.from(new Uint8Array(buffer), (b) => b.toString(16).padStart(2, "0")).join("");

async function hmac(key, text) {
  const imported = await crypto.subtle.importKey(
    "raw", key, { name: "HMAC", hash: "SHA-256" }, false, ["sign"],
  );
  return crypto.subtle.sign("HMAC", imported, encoder.encode(text));
}

async function sha256Hex(text) {
  return hex(await crypto.subtle.digest("SHA-256", encoder.encode(text)));
}

// RFC 3986 encoding, as Python's quote(safe="-_.~") does it.
const encode = (s) =>
  encodeURIComponent(s).replace(/[!'()*]/g, (c) => "%" + c.charCodeAt(0).toString(16).toUpperCase());

const canonicalUri = (path) => path.split("/").map(encode).join("/");

function canonicalQuery(search) {
  const pairs = [];
  for (const [k, v] of new URLSearchParams(search)) pairs.push([encode(k), encode(v)]);
  pairs.sort((a, b) => (a[0] === b[0] ? (a[1] < b[1] ? -1 : 1) : a[0] < b[0] ? -1 : 1));
  return pairs.map(([k, v]) => `${k}=${v}`).join("&");
}

async function signatureHeaders(url, creds, method = "GET", body = "", extra = {}) {
  const u = new URL(url, location.href);
  const stamp = new Date().toISOString().replace(/[-:]/g, "").replace(/\.\d+/, "");
  const day = stamp.slice(0, 8);
  const payload = body ? await sha256Hex(body) : EMPTY_SHA256;
  const headers = { host: u.host, "x-amz-content-sha256": payload, "x-amz-date": stamp };
  for (const [k, v] of Object.entries(extra)) headers[k.toLowerCase()] = String(v).trim();
  const names = Object.keys(headers).sort();
  const signed = names.join(";");
  const canonical = [
    method,
    canonicalUri(u.pathname),
    canonicalQuery(u.search),
    names.map((n) => `${n}:${headers[n]}\n`).join(""),
    signed,
    payload,
  ].join("\n");
  const scope = `${day}/${REGION}/${SERVICE}/aws4_request`;
  const toSign = ["AWS4-HMAC-SHA256", stamp, scope, await sha256Hex(canonical)].join("\n");
  let key = encoder.encode("AWS4" + creds.secret);
  for (const part of [day, REGION, SERVICE, "aws4_request"]) key = await hmac(key, part);
  const signature = hex(await hmac(key, toSign));
  delete headers.host; // the browser sends it, as signed
  return {
    ...headers,
    authorization:
      `AWS4-HMAC-SHA256 Credential=${creds.key}/${scope}, ` +
      `SignedHeaders=${signed}, Signature=${signature}`,
  };
}

// A request as any client sends it: signed under auth:, its `extra` headers covered.
export async function send(url, method = "GET", body = "", extra = {}, signal = undefined) {
  let headers = { ...extra };
  if (AUTH) {
    const creds = credentials();
    if (!creds) throw new AuthError("MissingAuthenticationTokenException", "Sign in first.");
    headers = await signatureHeaders(url, creds, method, body, extra);
  }
  const init = { method, headers, cache: "no-store", credentials: "omit", signal };
  if (method !== "GET") init.body = body;
  return fetch(url, init);
}

// A read of a view (a GET, safe to repeat) given up after this long: the poller that
// asked tries again rather than waiting on a lost connection for ever.
const READ_TIMEOUT_MS = 10_000;

export async function api(url) {
  const response = await send(url, "GET", "", {}, AbortSignal.timeout(READ_TIMEOUT_MS));
  if (response.status === 403) {
    const answer = await response.json().catch(() => ({}));
    throw new AuthError(answer.__type || "AccessDeniedException", answer.message || "Refused.");
  }
  return response;
}

export class ApiError extends Error {
  constructor(type, message) {
    super(message);
    this.type = type;
  }
}

const TARGETS = {
  sagemaker: ["SageMaker", "application/x-amz-json-1.1"],
  "application-autoscaling": ["AnyScaleFrontendService", "application/x-amz-json-1.1"],
  cloudwatch: ["GraniteServiceVersion20100801", "application/x-amz-json-1.0"],
};

// One action of the public API (POST /, X-Amz-Target), called as boto3 calls it:
// the gateway authorises it exactly as it would boto3's.
export async function call(action, params) {
  const [service, name] = action.split(":");
  const [prefix, type] = TARGETS[service];
  const body = JSON.stringify(params);
  const response = await send("/", "POST", body, {
    "content-type": type,
    "x-amz-target": `${prefix}.${name}`,
  });
  const text = await response.text();
  let answer = {};
  try {
    answer = text ? JSON.parse(text) : {};
  } catch (_) {
    answer = { message: text };
  }
  if (!response.ok) {
    const kind = String(answer.__type || response.status).split("#").pop();
    throw new ApiError(kind, answer.message || answer.Message || text || "Refused.");
  }
  return answer;
}
