#!/usr/bin/env node
// `npx cdk ...` runs this file (package.json "bin" names it `cdk`): the pinned AWS CDK CLI
// (node_modules/aws-cdk) with the same arguments, exit code and output, with one difference.
//
// The CDK CLI reports any failure of the app it runs as its own exit code 1 ("Subprocess exited with
// error 2"). The app (infra/app.py) exits 2 on input the user must fix, after printing the one message
// naming the field and the fix, and then also creates the file NVRX_EKS_USER_ERROR_FILE names.
// When that file exists after the CLI ends, this wrapper exits 2, as the kit documents for bad input.
//
// It also tells the app when the command deploys (NVRX_EKS_CDK_COMMAND): the app then refuses to
// start without a recent passing `nvrx-eks preflight` of the same config (infra/deploy_gate.py).
"use strict";

const { spawnSync } = require("node:child_process");
const fs = require("node:fs");
const os = require("node:os");
const path = require("node:path");

const USER_ERROR_EXIT_CODE = 2;
const root = path.resolve(__dirname, "..");
const cli = path.join(root, "node_modules", "aws-cdk", "bin", "cdk");
const scratch = fs.mkdtempSync(path.join(os.tmpdir(), "nvrx-eks-cdk-"));
const marker = path.join(scratch, "user-error");
// `cdk deploy` and `cdk watch` deploy; every other command only synthesizes or reads.
const DEPLOY_COMMANDS = ["deploy", "watch"];
const args = process.argv.slice(2);
const deploying = DEPLOY_COMMANDS.find((command) => args.includes(command));

let code = 1;
try {
  const done = spawnSync(process.execPath, [cli, ...process.argv.slice(2)], {
    stdio: "inherit",
    env: {
      ...process.env,
      NVRX_EKS_USER_ERROR_FILE: marker,
      NVRX_EKS_CDK_COMMAND: deploying || "",
    },
  });
  if (done.error) {
    console.error(`error: cannot run the AWS CDK CLI at ${cli} (${done.error.message}); run npm ci`);
  } else if (fs.existsSync(marker)) {
    code = USER_ERROR_EXIT_CODE;
  } else if (done.status !== null) {
    code = done.status;
  } else {
    code = 128 + (os.constants.signals[done.signal] || 0);
  }
} finally {
  fs.rmSync(scratch, { recursive: true, force: true });
}
process.exit(code);
