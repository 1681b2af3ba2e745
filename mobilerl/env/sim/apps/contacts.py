"""Contacts (modelled on Simple Contacts / Google Contacts): list, search, details, create/edit, delete."""

from __future__ import annotations

from dataclasses import dataclass

from mobilerl.env.sim import content
from mobilerl.env.sim.device import App, PageState
from mobilerl.env.sim.ui import Button, Dialog, Field, IconButton, Page, Row, Text


@dataclass
class Contact:
    first: str
    last: str = ""
    phone: str = ""
    email: str = ""
    address: str = ""
    company: str = ""
    favorite: bool = False

    @property
    def name(self) -> str:
        return f"{self.first} {self.last}".strip()


def digits(s: str) -> str:
    return "".join(ch for ch in s if ch.isdigit())


class Contacts(App):
    name = "Contacts"
    package = "com.simplemobiletools.contacts.pro"
    color = (25, 118, 210)
    aliases = ("contacts", "phone book")

    def setup(self) -> None:
        self.contacts: list[Contact] = [
            Contact(p.first, p.last, p.phone, p.email, p.address, p.company)
            for p in content.people(self.rng, self.rng.randrange(14, 22))
        ]

    # -- queries used by tasks
    def find(self, name: str) -> Contact | None:
        want = " ".join(name.lower().split())
        return next((c for c in self.contacts if c.name.lower() == want), None)

    def ordered(self) -> list[Contact]:
        return sorted(self.contacts, key=lambda c: c.name.lower())

    # -- pages
    def _rows(self, people: list[Contact]) -> list[Row]:
        return [Row(c.name, on_tap=lambda c=c: self.push("details", contact=c), rid="contact_name",
                    avatar=True) for c in people]

    def page_main(self, st: PageState) -> Page:
        body: list = self._rows(self.ordered()) or [Text("No contacts", rid="empty")]
        return Page("Contacts", body=body,
                    actions=[IconButton("Search", lambda: self.push("search"), rid="search")],
                    fab=IconButton("Create contact", lambda: self.push("edit", contact=None), rid="fab"),
                    scroll_rid="contacts_list")

    def page_search(self, st: PageState) -> Page:
        q = st.fields.get("query", "").lower()
        hits = [c for c in self.ordered() if q and (q in c.name.lower() or q in digits(c.phone))]
        return Page("Search", nav_back=True, body=[Field("query", "Search contacts", rid="search_field"),
                                                  *self._rows(hits)])

    def page_details(self, st: PageState) -> Page:
        c: Contact = st.args["contact"]
        body: list = []
        if c.phone:
            body.append(Row(c.phone, "Mobile", rid="phone_number",
                            trailing=IconButton("Send message", lambda: self._message(c), rid="sms")))
        if c.email:
            body.append(Row(c.email, "Email", rid="email"))
        if c.address:
            body.append(Row(c.address, "Address", rid="address"))
        if c.company:
            body.append(Row(c.company, "Company", rid="company"))

        def delete() -> None:
            if c in self.contacts:  # the same contact's page can be on the stack twice
                self.contacts.remove(c)
            self.pop()

        page = Page(c.name, body=body, nav_back=True, actions=[
            IconButton("Favorite" if not c.favorite else "Remove from favorites", lambda: self._fav(c),
                       rid="favorite"),
            IconButton("Edit", lambda: self.push("edit", contact=c), rid="edit"),
            IconButton("Delete", lambda: self.dialog(lambda: Dialog(
                "Delete contact?", f"{c.name} will be removed from your contacts.",
                buttons=[Button("Cancel", self.close_dialog, rid="cancel", primary=False),
                         Button("Delete", delete, rid="confirm_delete")])), rid="delete"),
        ])
        return page

    def _fav(self, c: Contact) -> None:
        c.favorite = not c.favorite

    def _message(self, c: Contact) -> None:
        self.device.log.append(f"open_sms:{c.phone}")
        sms = self.device.resolve_app("SMS Messenger")
        if sms:
            self.device.launch(sms)
            self.device.apps[sms].open_thread(c.phone)  # type: ignore[attr-defined]

    def page_edit(self, st: PageState) -> Page:
        c: Contact | None = st.args.get("contact")
        if not st.fields and c is not None:  # pre-fill from the contact being edited
            st.fields.update(first_name=c.first, last_name=c.last, phone=c.phone, email=c.email,
                             company=c.company)

        def save() -> None:
            f = st.fields
            if not (f.get("first_name") or f.get("last_name")):
                self.device.toast = "Name is empty"
                return
            target = c or Contact(first="")
            target.first, target.last = f.get("first_name", ""), f.get("last_name", "")
            target.phone, target.email = f.get("phone", ""), f.get("email", "")
            target.company = f.get("company", "")
            if c is None:
                self.contacts.append(target)
            self.replace("details", contact=target)

        return Page("Edit contact" if c else "Create contact", nav_back=True, body=[
            Field("first_name", "First name", rid="first_name"),
            Field("last_name", "Last name", rid="last_name"),
            Field("phone", "Phone", rid="phone"),
            Field("email", "Email", rid="email"),
            Field("company", "Company", rid="company"),
        ], actions=[IconButton("Save", save, rid="save")])
