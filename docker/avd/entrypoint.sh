#!/usr/bin/env bash
# Boot the AVD headless, wait until Android reports boot completed, then exec the env server (CMD).
set -euo pipefail
emulator -avd mobilerl -no-window -no-audio -no-boot-anim -gpu swiftshader_indirect -no-snapshot-save \
  -port 5554 >/var/log/emulator.log 2>&1 &
adb wait-for-device
for _ in $(seq 300); do
  [ "$(adb shell getprop sys.boot_completed 2>/dev/null | tr -d '\r')" = "1" ] && break
  sleep 1
done
[ "$(adb shell getprop sys.boot_completed | tr -d '\r')" = "1" ] || { echo "AVD did not boot"; exit 1; }
adb shell settings put global window_animation_scale 0
adb shell settings put global transition_animation_scale 0
adb shell settings put global animator_duration_scale 0
exec "$@"
