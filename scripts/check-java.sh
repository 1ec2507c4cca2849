#!/usr/bin/env bash
# Spark 4 needs Java 17+. Install Debian's JRE when run as root, otherwise say how.
set -euo pipefail
java_major() {
  local java="${JAVA_HOME:+$JAVA_HOME/bin/}java"
  command -v "$java" >/dev/null 2>&1 || { echo 0; return; }
  "$java" -version 2>&1 | head -1 | sed -E 's/.*version "([0-9]+)(\.([0-9]+))?.*/\1 \3/' |
    awk '{ print ($1 == 1 ? $2 : $1) }'
}
if [ "$(java_major)" -ge 17 ] 2>/dev/null; then exit 0; fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "Java 17+ not found: installing Debian's openjdk-17-jre-headless" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless
  exit 0
fi
echo "Java 17+ is required by Spark and was not found." >&2
echo "Install it (Debian/Ubuntu: sudo apt-get install -y openjdk-17-jre-headless) or set JAVA_HOME." >&2
exit 1
