// The shipyard console's entry script: no framework, no build step (ES modules, served
// as they are). A page is a shell (gateway/console/pages.py); this fills its regions
// from the gateway's /console/api/ views and keeps them fresh (polling.js, charts.js),
// signs every call under auth: (signing.js), and runs its controls, each a call of the
// public API (actions.js, tryit.js).

import { startActions } from "./actions.js";
import { watchCharts } from "./charts.js";
import {
  session,
  showProblem,
  watchLog,
  watchView,
  watchWhenApplies,
} from "./polling.js";
import { AUTH, STORAGE_KEY, credentials } from "./signing.js";
import { startTryIt } from "./tryit.js";

const problem = document.getElementById("problem");
const content = document.getElementById("content");

function filterList(form) {
  const view = form.nextElementSibling;
  const base = view.dataset.view.split("?")[0];
  const refresh = (page) => {
    const query = new URLSearchParams();
    for (const input of form.elements) if (input.name && input.value) query.set(input.name, input.value);
    if (page) query.set("page", page);
    view.dataset.view = base + (query.toString() ? "?" + query : "");
    view.dispatchEvent(new Event("refresh"));
  };
  let timer = null;
  form.addEventListener("input", () => {
    clearTimeout(timer);
    timer = setTimeout(() => refresh(0), 250);
  });
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    refresh(0);
  });
  view.addEventListener("click", (event) => {
    const button = event.target.closest("[data-page]");
    if (button) refresh(button.dataset.page);
  });
}

// -- sign-in and start -----------------------------------------------------------------

const form = document.getElementById("signin");
const signOutButton = document.getElementById("signout");

function start() {
  session.generation += 1;
  form.hidden = true;
  content.hidden = false;
  signOutButton.hidden = !AUTH;
  startActions();
  startTryIt();
  document.querySelectorAll("form.filter").forEach(filterList);
  watchWhenApplies();
  document.querySelectorAll("[data-view]:not([data-when])").forEach(watchView);
  document.querySelectorAll("[data-metrics]").forEach(watchCharts);
  document.querySelectorAll("[data-log]").forEach(watchLog);
}

function signOut(reason) {
  session.generation += 1;
  sessionStorage.removeItem(STORAGE_KEY);
  signOutButton.hidden = true;
  content.hidden = true;
  form.hidden = false;
  if (reason) showProblem(reason, "auth");
  else problem.hidden = true;
  form.elements.key.focus();
}

form.addEventListener("submit", (event) => {
  event.preventDefault();
  const key = form.elements.key.value.trim();
  const secret = form.elements.secret.value;
  sessionStorage.setItem(STORAGE_KEY, JSON.stringify({ key, secret }));
  form.reset();
  problem.hidden = true;
  // Pollers fill regions anew: reload so charts and logs start clean.
  location.reload();
});
signOutButton.addEventListener("click", () => signOut(null));
session.signOut = signOut;

if (AUTH && !(window.crypto && crypto.subtle)) {
  content.hidden = true;
  showProblem(
    "Signing needs Web Crypto, which browsers give only to secure pages: open the console " +
      "over https or on localhost.", "auth");
} else if (AUTH && !credentials()) {
  signOut(null);
} else {
  start();
}
