# Android emulator env worker: one AVD (x86_64, headless, KVM) + the project's adb backend + env server.
#   docker build -f docker/avd-worker.Dockerfile -t mobilerl/avd-worker .
#   needs /dev/kvm on the host (compose passes it through)
FROM ubuntu:22.04
ENV DEBIAN_FRONTEND=noninteractive PYTHONUNBUFFERED=1 ANDROID_SDK_ROOT=/opt/android-sdk \
    ANDROID_SERIAL=emulator-5554
ARG CMDLINE_TOOLS=commandlinetools-linux-11076708_latest.zip
ARG SYSTEM_IMAGE="system-images;android-33;google_apis;x86_64"
RUN apt-get update && apt-get install -y --no-install-recommends \
      openjdk-17-jre-headless unzip wget python3.11 python3.11-venv libpulse0 libgl1 libnss3 libxcomposite1 \
      libxcursor1 libxi6 libxtst6 libasound2 \
    && rm -rf /var/lib/apt/lists/*
RUN mkdir -p $ANDROID_SDK_ROOT/cmdline-tools \
    && wget -q https://dl.google.com/android/repository/$CMDLINE_TOOLS -O /tmp/tools.zip \
    && unzip -q /tmp/tools.zip -d $ANDROID_SDK_ROOT/cmdline-tools && mv $ANDROID_SDK_ROOT/cmdline-tools/cmdline-tools $ANDROID_SDK_ROOT/cmdline-tools/latest \
    && rm /tmp/tools.zip
ENV PATH=$ANDROID_SDK_ROOT/cmdline-tools/latest/bin:$ANDROID_SDK_ROOT/platform-tools:$ANDROID_SDK_ROOT/emulator:$PATH
RUN yes | sdkmanager --licenses >/dev/null \
    && sdkmanager "platform-tools" "emulator" "$SYSTEM_IMAGE" \
    && echo no | avdmanager create avd -n mobilerl -k "$SYSTEM_IMAGE" -d pixel_6
RUN python3.11 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /app
COPY pyproject.toml constraints.txt README.md ./
COPY mobilerl ./mobilerl
RUN pip install --no-cache-dir -c constraints.txt -e .
COPY docker/avd/entrypoint.sh /usr/local/bin/avd-entrypoint.sh
EXPOSE 8765
ENTRYPOINT ["/usr/local/bin/avd-entrypoint.sh"]
CMD ["mobilerl", "env", "serve", "--host", "0.0.0.0", "--port", "8765", "--backend", "adb", "--size", "1", "--no-isolate"]
